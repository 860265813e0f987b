package textconn

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"runtime"
	"strconv"
	"sync"
	"testing"
	"time"
)

// goroutineID returns the calling goroutine's number from its stack
// header ("goroutine 42 [running]:").
func goroutineID(t testing.TB) uint64 {
	var buf [64]byte
	b := buf[:runtime.Stack(buf[:], false)]
	b = bytes.TrimPrefix(b, []byte("goroutine "))
	id, err := strconv.ParseUint(string(b[:bytes.IndexByte(b, ' ')]), 10, 64)
	if err != nil {
		t.Fatalf("stack header %q: %v", buf[:], err)
	}
	return id
}

// TestServerReusesWorkers: connections served one after another run on
// the goroutine that served the first, so a session's grown stack is not
// grown anew for each connection.
func TestServerReusesWorkers(t *testing.T) {
	const n = 20
	var mu sync.Mutex
	ids := make(map[uint64]int)
	s := &Server{Name: "t", Logger: slog.New(slog.DiscardHandler),
		Handler: func(ctx context.Context, nc net.Conn, shutdown <-chan struct{}) {
			mu.Lock()
			ids[goroutineID(t)]++
			mu.Unlock()
			_, _ = io.WriteString(nc, "BYE\r\n")
		}}
	addr := serve(t, s)
	for i := range n {
		c := dial(t, addr)
		c.expect("BYE")
		c.expectEOF()
		// The worker that closed c goes back to wait for the next
		// connection right after; wait for it, so that the next accept
		// finds it idle.
		deadline := time.Now().Add(10 * time.Second)
		for s.idle.Load() == 0 {
			if time.Now().After(deadline) {
				t.Fatalf("connection %d: no worker went idle", i)
			}
			runtime.Gosched()
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if len(ids) != 1 {
		t.Errorf("%d sequential connections ran on %d goroutines, want 1", n, len(ids))
	}
}

// TestServerBoundsIdleWorkers: after a burst of concurrent connections
// ends, at most maxIdleWorkers goroutines stay waiting, and Shutdown
// ends them all.
func TestServerBoundsIdleWorkers(t *testing.T) {
	const n = maxIdleWorkers + 16
	before := runtime.NumGoroutine()
	release := make(chan struct{})
	var started sync.WaitGroup
	started.Add(n)
	s := &Server{Name: "t", Logger: slog.New(slog.DiscardHandler),
		Handler: func(ctx context.Context, nc net.Conn, shutdown <-chan struct{}) {
			started.Done()
			<-release
		}}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	errc := make(chan error, 1)
	go func() { errc <- s.Serve(ln) }()
	var conns []net.Conn
	for range n {
		c, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		conns = append(conns, c)
	}
	started.Wait() // n handlers at once: n workers
	close(release)
	for _, c := range conns {
		if _, err := bufio.NewReader(c).ReadByte(); !errors.Is(err, io.EOF) {
			t.Fatalf("read after the handler returned: %v, want EOF", err)
		}
		c.Close()
	}
	// Every worker either waits or has exited; count the waiting ones
	// once all have settled.
	deadline := time.Now().Add(10 * time.Second)
	for runtime.NumGoroutine()-before > maxIdleWorkers+1 { // +1: Serve
		if time.Now().After(deadline) {
			t.Fatalf("%d goroutines above the start after the burst, want at most %d", runtime.NumGoroutine()-before, maxIdleWorkers+1)
		}
		time.Sleep(time.Millisecond)
	}
	if got := s.idle.Load(); got > maxIdleWorkers {
		t.Errorf("%d idle workers, want at most %d", got, maxIdleWorkers)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := s.Shutdown(ctx); err != nil {
		t.Fatalf("Shutdown: %v", err)
	}
	if err := <-errc; !errors.Is(err, ErrServerClosed) {
		t.Errorf("Serve returned %v", err)
	}
	// Shutdown waited for every worker (the WaitGroup counts them).
	if got := s.idle.Load(); got != 0 {
		t.Errorf("%d workers still idle after Shutdown", got)
	}
}

// BenchmarkServerConnection is the accept loop's cost per connection:
// accept, the Limiter, a worker, a handler that writes one line, close,
// with the client's dial and read (the per-connection path below every
// protocol). Run it with -benchmem: allocs/op are the connection's,
// client included.
func BenchmarkServerConnection(b *testing.B) {
	s := &Server{Name: "bench", Logger: slog.New(slog.DiscardHandler),
		Limiter: NewLimiter(100, 1000), Metrics: NewMetrics(nil, "bench"),
		Handler: func(ctx context.Context, nc net.Conn, shutdown <-chan struct{}) {
			c := New(nc, Options{MaxLine: 512, ReadTimeout: time.Minute, WriteTimeout: time.Minute})
			defer c.Release()
			stop := c.WatchShutdown(shutdown)
			defer stop()
			_, _ = c.WriteString("220 ready\r\n")
			_ = c.Flush()
		}}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	errc := make(chan error, 1)
	go func() { errc <- s.Serve(ln) }()
	defer func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := s.Shutdown(ctx); err != nil {
			b.Errorf("Shutdown: %v", err)
		}
		<-errc
	}()
	addr := ln.Addr().String()
	buf := make([]byte, 64)
	b.ReportAllocs()
	for b.Loop() {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			b.Fatal(err)
		}
		for n := 0; ; {
			m, err := c.Read(buf[n:])
			n += m
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				b.Fatal(err)
			}
		}
		c.Close()
	}
}
