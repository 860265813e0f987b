package textconn

import (
	"bufio"
	"compress/flate"
	"crypto/tls"
	"errors"
	"io"
	"os"
	"testing"
	"time"
)

// deflateStream is raw deflate both ways (RFC 4978), as a protocol front
// end would build it for Wrap.
type deflateStream struct {
	r io.Reader
	w *flate.Writer
}

func newDeflateStream(rw io.ReadWriter) io.ReadWriter {
	w, _ := flate.NewWriter(rw, flate.BestSpeed)
	return &deflateStream{r: flate.NewReader(rw), w: w}
}

func (d *deflateStream) Read(p []byte) (int, error)  { return d.r.Read(p) }
func (d *deflateStream) Write(p []byte) (int, error) { return d.w.Write(p) }
func (d *deflateStream) Flush() error                { return d.w.Flush() }

// countWriter counts bytes written through it.
type countWriter struct {
	w io.Writer
	n int
}

func (c *countWriter) Write(p []byte) (int, error) { c.n += len(p); return c.w.Write(p) }

func TestWrapDeflateAboveTLS(t *testing.T) {
	srvCfg, cliCfg := testTLS(t)
	c, client := pipe(t, Options{MaxLine: 100, ReadTimeout: 10 * time.Second, WriteTimeout: 10 * time.Second})
	type side struct {
		br  *bufio.Reader
		raw *countWriter
		zw  *flate.Writer
	}
	ready := make(chan side, 1)
	errc := make(chan error, 1)
	go func() {
		tc := tls.Client(client, cliCfg)
		if err := tc.Handshake(); err != nil {
			errc <- err
			return
		}
		if _, err := io.WriteString(tc, "COMPRESS\r\n"); err != nil {
			errc <- err
			return
		}
		plain := bufio.NewReader(tc)
		// The reply to the command that asked for the change is sent in the
		// old encoding.
		if l, err := plain.ReadString('\n'); err != nil || l != "OK compressing\r\n" {
			errc <- errors.New("bad reply: " + l)
			return
		}
		if plain.Buffered() > 0 {
			errc <- errors.New("compressed bytes arrived with the plaintext reply")
			return
		}
		cw := &countWriter{w: tc}
		zw, _ := flate.NewWriter(cw, flate.BestSpeed)
		errc <- nil
		ready <- side{br: bufio.NewReader(flate.NewReader(tc)), raw: cw, zw: zw}
	}()
	if err := c.StartTLS(srvCfg); err != nil {
		t.Fatal(err)
	}
	if l, err := c.ReadLine(); err != nil || string(l) != "COMPRESS" {
		t.Fatalf("got %q, %v", l, err)
	}
	_, _ = c.WriteString("OK compressing\r\n")
	// Wrap flushes the reply through TLS before the swap.
	if err := c.Wrap(newDeflateStream); err != nil {
		t.Fatal(err)
	}
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	cl := <-ready

	// Client to server: two pipelined lines in one deflate flush.
	go func() {
		_, _ = io.WriteString(cl.zw, "FIRST\r\nSECOND\r\n")
		_ = cl.zw.Flush()
	}()
	for _, want := range []string{"FIRST", "SECOND"} {
		if l, err := c.ReadLine(); err != nil || string(l) != want {
			t.Fatalf("got %q, %v; want %q", l, err, want)
		}
	}
	// Server to client: Flush pushes the compressor's output.
	long := make([]byte, 0, 8000)
	for len(long) < 7990 {
		long = append(long, "* 1 FETCH (FLAGS (\\Seen))\r\n"...)
	}
	_, _ = c.Write(long)
	if err := c.Flush(); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, len(long))
	if _, err := io.ReadFull(cl.br, got); err != nil || string(got) != string(long) {
		t.Fatalf("client read %d bytes, %v", len(got), err)
	}
	if cl.br.Buffered() > 0 {
		t.Fatal("extra output after a flush")
	}

	if err := c.StartTLS(srvCfg); err == nil {
		t.Fatal("StartTLS succeeded beneath the compressor")
	}
	// The read deadline still applies beneath the wrapper.
	c.SetReadTimeout(50 * time.Millisecond)
	if _, err := c.ReadLine(); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("got %v, want deadline exceeded", err)
	}
}

func TestWrapRefusesPipelinedInput(t *testing.T) {
	c, client := pipe(t, Options{MaxLine: 100, ReadTimeout: 10 * time.Second})
	if _, err := io.WriteString(client, "COMPRESS\r\nNOOP\r\n"); err != nil {
		t.Fatal(err)
	}
	if l, err := c.ReadLine(); err != nil || string(l) != "COMPRESS" {
		t.Fatalf("got %q, %v", l, err)
	}
	// NOOP was read ahead with COMPRESS in one segment, or arrives later;
	// wait until it is buffered so the refusal is deterministic.
	if !c.HasLine() {
		if _, err := c.Reader().Peek(len("NOOP\r\n")); err != nil {
			t.Fatal(err)
		}
	}
	called := false
	err := c.Wrap(func(rw io.ReadWriter) io.ReadWriter { called = true; return rw })
	if !errors.Is(err, ErrPipelined) || called {
		t.Fatalf("Wrap = %v (called %v), want ErrPipelined without a swap", err, called)
	}
	if l, err := c.ReadLine(); err != nil || string(l) != "NOOP" {
		t.Fatalf("the refused swap lost input: %q, %v", l, err)
	}
}

// TestFlushIdleWrapper checks that a Flush with nothing written does not
// make the wrapper emit anything (a deflate sync flush would be 5 bytes).
func TestFlushIdleWrapper(t *testing.T) {
	c, client := pipe(t, Options{MaxLine: 100, WriteTimeout: 10 * time.Second})
	var flushes int
	err := c.Wrap(func(rw io.ReadWriter) io.ReadWriter {
		return &flushCounter{ReadWriter: rw, n: &flushes}
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Flush(); err != nil || flushes != 0 {
		t.Fatalf("idle Flush: %v, %d wrapper flushes", err, flushes)
	}
	_, _ = c.WriteString("x\r\n")
	if err := c.Flush(); err != nil || flushes != 1 {
		t.Fatalf("Flush: %v, %d wrapper flushes", err, flushes)
	}
	if err := c.Flush(); err != nil || flushes != 1 {
		t.Fatalf("second Flush: %v, %d wrapper flushes", err, flushes)
	}
	buf := make([]byte, 3)
	if _, err := io.ReadFull(client, buf); err != nil || string(buf) != "x\r\n" {
		t.Fatalf("got %q, %v", buf, err)
	}
}

type flushCounter struct {
	io.ReadWriter
	n *int
}

func (f *flushCounter) Flush() error { *f.n++; return nil }
