package textconn

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// echoHandler serves "ECHO x" lines and says BYE on shutdown; "PANIC" panics.
func echoHandler(started chan<- struct{}) Handler {
	return func(ctx context.Context, nc net.Conn, shutdown <-chan struct{}) {
		c := New(nc, Options{MaxLine: 100, ReadTimeout: time.Minute, WriteTimeout: time.Minute})
		stop := c.WatchShutdown(shutdown)
		defer stop()
		if started != nil {
			started <- struct{}{}
		}
		for {
			line, err := c.ReadLine()
			switch {
			case errors.Is(err, ErrShutdown):
				_, _ = c.WriteString("BYE\r\n")
				_ = c.Flush()
				return
			case err != nil:
				return
			}
			switch s := string(line); {
			case s == "PANIC":
				panic("handler panic")
			case s == "BODY":
				// The body is read after the shutdown signal: a command
				// in progress is not interrupted.
				_, _ = c.WriteString("GO\r\n")
				_ = c.Flush()
				<-shutdown
				buf := make([]byte, 5)
				if _, err := io.ReadFull(c.Reader(), buf); err != nil {
					return
				}
				_, _ = c.Write(append(buf, "\r\n"...))
				_ = c.Flush()
			default:
				_, _ = c.WriteString(strings.TrimPrefix(s, "ECHO ") + "\r\n")
				_ = c.Flush()
			}
		}
	}
}

func serve(t *testing.T, s *Server) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	errc := make(chan error, 1)
	go func() { errc <- s.Serve(ln) }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := s.Shutdown(ctx); err != nil {
			t.Errorf("Shutdown: %v", err)
		}
		if err := <-errc; !errors.Is(err, ErrServerClosed) {
			t.Errorf("Serve returned %v", err)
		}
	})
	return ln.Addr().String()
}

type client struct {
	t  *testing.T
	nc net.Conn
	br *bufio.Reader
}

func dial(t *testing.T, addr string) *client {
	t.Helper()
	nc, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { nc.Close() })
	return &client{t, nc, bufio.NewReader(nc)}
}

func (c *client) send(s string) {
	c.t.Helper()
	if _, err := io.WriteString(c.nc, s+"\r\n"); err != nil {
		c.t.Fatal(err)
	}
}

func (c *client) expect(want string) {
	c.t.Helper()
	got, err := c.br.ReadString('\n')
	if err != nil || got != want+"\r\n" {
		c.t.Fatalf("got %q, %v; want %q", got, err, want)
	}
}

func (c *client) expectEOF() {
	c.t.Helper()
	if b, err := c.br.ReadByte(); !errors.Is(err, io.EOF) {
		c.t.Fatalf("got %q, %v; want EOF", b, err)
	}
}

func counter(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		var sum float64
		for _, m := range mf.GetMetric() {
			sum += value(m)
		}
		return sum
	}
	return 0
}

func value(m *dto.Metric) float64 {
	if m.Counter != nil {
		return m.Counter.GetValue()
	}
	return m.Gauge.GetValue()
}

func TestServerShutdownTellsIdleClients(t *testing.T) {
	reg := prometheus.NewRegistry()
	started := make(chan struct{}, 2)
	s := &Server{Name: "test", Handler: echoHandler(started), Metrics: NewMetrics(reg, "test")}
	addr := serve(t, s)
	a, b := dial(t, addr), dial(t, addr)
	a.send("ECHO hi")
	a.expect("hi")
	<-started
	<-started
	if got := counter(t, reg, "quill_connections_active"); got != 2 {
		t.Fatalf("active = %v", got)
	}
	if err := s.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	a.expect("BYE")
	a.expectEOF()
	b.expect("BYE")
	b.expectEOF()
	if got := counter(t, reg, "quill_connections_total"); got != 2 {
		t.Fatalf("connections_total = %v", got)
	}
	if got := counter(t, reg, "quill_connections_active"); got != 0 {
		t.Fatalf("active after shutdown = %v", got)
	}
	if _, err := net.Dial("tcp", addr); err == nil {
		t.Fatal("listener still accepting after Shutdown")
	}
}

func TestServerShutdownLetsCommandFinish(t *testing.T) {
	s := &Server{Name: "test", Handler: echoHandler(nil)}
	addr := serve(t, s)
	c := dial(t, addr)
	c.send("BODY")
	c.expect("GO")
	done := make(chan error, 1)
	go func() { done <- s.Shutdown(context.Background()) }()
	_, _ = io.WriteString(c.nc, "hello")
	c.expect("hello")
	c.expect("BYE")
	c.expectEOF()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

func TestServerShutdownDeadlineCloses(t *testing.T) {
	block := make(chan struct{})
	var once sync.Once
	s := &Server{Name: "test", Handler: func(ctx context.Context, nc net.Conn, _ <-chan struct{}) {
		once.Do(func() { close(block) })
		<-ctx.Done() // ignores the shutdown signal; only Close ends it
	}}
	addr := serve(t, s)
	c := dial(t, addr)
	<-block
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := s.Shutdown(ctx); !errors.Is(err, context.Canceled) {
		t.Fatalf("Shutdown = %v, want context.Canceled", err)
	}
	c.expectEOF()
}

func TestServerRecoversPanic(t *testing.T) {
	var logs bytes.Buffer
	var mu sync.Mutex
	logger := slog.New(slog.NewTextHandler(&lockedWriter{w: &logs, mu: &mu}, nil))
	s := &Server{Name: "test", Handler: echoHandler(nil), Logger: logger}
	addr := serve(t, s)
	c := dial(t, addr)
	c.send("PANIC")
	c.expectEOF()
	d := dial(t, addr)
	d.send("ECHO still serving")
	d.expect("still serving")
	mu.Lock()
	defer mu.Unlock()
	if !strings.Contains(logs.String(), "handler panic") || !strings.Contains(logs.String(), "goroutine") {
		t.Fatalf("panic not logged with stack: %s", logs.String())
	}
}

type lockedWriter struct {
	w  io.Writer
	mu *sync.Mutex
}

func (w *lockedWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.w.Write(p)
}

func TestServerLimiter(t *testing.T) {
	reg := prometheus.NewRegistry()
	started := make(chan struct{}, 1)
	s := &Server{
		Name: "test", Handler: echoHandler(started), Metrics: NewMetrics(reg, "test"),
		Limiter: NewLimiter(1, 10), LimitReply: "421 busy\r\n",
	}
	addr := serve(t, s)
	a := dial(t, addr)
	<-started
	b := dial(t, addr)
	b.expect("421 busy")
	b.expectEOF()
	if got := counter(t, reg, "quill_connections_rejected_total"); got != 1 {
		t.Fatalf("rejected = %v", got)
	}
	a.send("ECHO ok")
	a.expect("ok")
	a.nc.Close()
	// Once the first connection is released a new one is admitted.
	for {
		c := dial(t, addr)
		c.send("ECHO again")
		line, err := c.br.ReadString('\n')
		if err == nil && line == "again\r\n" {
			break
		}
		if err == nil && line != "421 busy\r\n" {
			t.Fatalf("unexpected %q", line)
		}
		// The release races with this dial; retry until it has happened.
	}
}

func TestServerCloseClosesConnections(t *testing.T) {
	started := make(chan struct{}, 1)
	s := &Server{Name: "test", Handler: echoHandler(started)}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	errc := make(chan error, 1)
	go func() { errc <- s.Serve(ln) }()
	c := dial(t, ln.Addr().String())
	<-started
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	// The handler may or may not manage a goodbye before its conn closes.
	if _, err := io.ReadAll(c.br); err != nil {
		t.Fatalf("want EOF, got %v", err)
	}
	if err := <-errc; !errors.Is(err, ErrServerClosed) {
		t.Fatalf("Serve = %v", err)
	}
	if err := s.Serve(ln); !errors.Is(err, ErrServerClosed) {
		t.Fatalf("Serve after Close = %v", err)
	}
	if err := s.Shutdown(context.Background()); err != nil {
		t.Fatalf("Shutdown after Close = %v", err)
	}
}

func TestLimiter(t *testing.T) {
	l := NewLimiter(2, 3)
	a := netip.MustParseAddr("192.0.2.1")
	b := netip.MustParseAddr("::ffff:192.0.2.2") // mapped: same as 192.0.2.2
	r1, ok1 := l.Acquire(a)
	r2, ok2 := l.Acquire(a)
	if !ok1 || !ok2 {
		t.Fatal("first two from one address refused")
	}
	if _, ok := l.Acquire(a); ok {
		t.Fatal("third from one address admitted")
	}
	r3, ok3 := l.Acquire(b)
	if !ok3 {
		t.Fatal("other address refused")
	}
	if _, ok := l.Acquire(netip.MustParseAddr("192.0.2.2")); ok {
		t.Fatal("total limit not enforced")
	}
	r1()
	r1() // idempotent
	if _, ok := l.Acquire(netip.MustParseAddr("192.0.2.9")); !ok {
		t.Fatal("slot not released")
	}
	r2()
	r3()

	v6 := NewLimiter(1, 0)
	if _, ok := v6.Acquire(netip.MustParseAddr("2001:db8::1")); !ok {
		t.Fatal("v6 refused")
	}
	if _, ok := v6.Acquire(netip.MustParseAddr("2001:db8::ffff")); ok {
		t.Fatal("same /64 admitted twice")
	}
	if _, ok := v6.Acquire(netip.MustParseAddr("2001:db8:0:1::1")); !ok {
		t.Fatal("other /64 refused")
	}

	var nilLimiter *Limiter
	if release, ok := nilLimiter.Acquire(a); !ok {
		t.Fatal("nil limiter refused")
	} else {
		release()
	}
}

func TestConnCountsBytes(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := NewMetrics(reg, "bytes")
	c, cl := pipe(t, Options{MaxLine: 100, Metrics: m})
	_, _ = io.WriteString(cl, "12345\r\n")
	if _, err := c.ReadLine(); err != nil {
		t.Fatal(err)
	}
	_, _ = c.WriteString("abc\r\n")
	if err := c.Flush(); err != nil {
		t.Fatal(err)
	}
	m.Command("NOOP")
	m.CommandError("NOOP")
	if got := counter(t, reg, "quill_bytes_received_total"); got != 7 {
		t.Fatalf("received = %v", got)
	}
	if got := counter(t, reg, "quill_bytes_sent_total"); got != 5 {
		t.Fatalf("sent = %v", got)
	}
	if counter(t, reg, "quill_commands_total") != 1 || counter(t, reg, "quill_command_errors_total") != 1 {
		t.Fatal("command counters")
	}
	var nilMetrics *Metrics
	nilMetrics.Command("NOOP") // must not panic
}

// TestShutdownWatchIsNoGoroutine: a connection watching its Server's
// shutdown channel costs no goroutine besides its handler's, and Shutdown
// still wakes every idle one, which says goodbye.
func TestShutdownWatchIsNoGoroutine(t *testing.T) {
	const n = 20
	started := make(chan struct{}, n)
	s := &Server{Name: "t", Handler: echoHandler(started), Logger: slog.New(slog.DiscardHandler)}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	errc := make(chan error, 1)
	go func() { errc <- s.Serve(ln) }()
	before := runtime.NumGoroutine()
	var conns []*bufio.Reader
	for range n {
		c, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		conns = append(conns, bufio.NewReader(c))
		<-started
	}
	// Each handler is blocked in ReadLine, or on its way there; a watcher
	// goroutine per connection would add n more.
	if d := runtime.NumGoroutine() - before; d >= 2*n {
		t.Errorf("%d connections added %d goroutines", n, d)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := s.Shutdown(ctx); err != nil {
		t.Fatalf("Shutdown: %v", err)
	}
	for i, br := range conns {
		if line, err := br.ReadString('\n'); line != "BYE\r\n" {
			t.Errorf("connection %d: %q, %v", i, line, err)
		}
	}
	if err := <-errc; !errors.Is(err, ErrServerClosed) {
		t.Errorf("Serve returned %v", err)
	}
	// The fired channel is no longer in the registry: a late watch falls
	// back to a goroutine, which sees it closed.
	if _, ok := shutdownSignals.Load((<-chan struct{})(s.mu.shutdown)); ok {
		t.Error("the shutdown channel of a Server shut down is still registered")
	}
}
