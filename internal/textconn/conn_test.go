package textconn

import (
	"bufio"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"io"
	"math/big"
	"net"
	"net/netip"
	"os"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
)

// pipe returns a server-side Conn and the client end of a real loopback
// TCP connection; both are closed when the test ends.
func pipe(t *testing.T, opts Options) (*Conn, net.Conn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	type res struct {
		c   net.Conn
		err error
	}
	ch := make(chan res, 1)
	go func() {
		c, err := ln.Accept()
		ch <- res{c, err}
	}()
	client, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	r := <-ch
	if r.err != nil {
		t.Fatal(r.err)
	}
	c := New(r.c, opts)
	t.Cleanup(func() {
		c.Close()
		client.Close()
	})
	return c, client
}

func TestReadLine(t *testing.T) {
	c, client := pipe(t, Options{MaxLine: 10, ReadTimeout: 10 * time.Second})
	long := strings.Repeat("x", 100000) // far beyond the buffer
	input := "crlf\r\nbare lf\n0123456789\r\n01234567890\r\n" + long + "\r\nafter\r\n\r\nlast\r\n"
	go func() { _, _ = io.WriteString(client, input) }()

	want := []struct {
		line string
		err  error
	}{
		{"crlf", nil},
		{"bare lf", nil},
		{"0123456789", nil}, // exactly MaxLine
		{"", ErrLineTooLong},
		{"", ErrLineTooLong},
		{"after", nil},
		{"", nil},
		{"last", nil},
	}
	for i, w := range want {
		line, err := c.ReadLine()
		if !errors.Is(err, w.err) || (err == nil && string(line) != w.line) {
			t.Fatalf("line %d: got %q, %v; want %q, %v", i, line, err, w.line, w.err)
		}
	}
	client.Close()
	if _, err := c.ReadLine(); !errors.Is(err, io.EOF) {
		t.Fatalf("after close: %v, want EOF", err)
	}
}

func TestReadLineUnterminatedAtEOF(t *testing.T) {
	c, client := pipe(t, Options{MaxLine: 100, ReadTimeout: 10 * time.Second})
	_, _ = io.WriteString(client, "partial")
	client.Close()
	if _, err := c.ReadLine(); !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Fatalf("got %v, want ErrUnexpectedEOF", err)
	}
}

func TestReadLineTimeout(t *testing.T) {
	c, client := pipe(t, Options{MaxLine: 100, ReadTimeout: 50 * time.Millisecond})
	// A client trickling an incomplete line does not extend the deadline:
	// the whole line must arrive within ReadTimeout.
	_, _ = io.WriteString(client, "NOO")
	start := time.Now()
	_, err := c.ReadLine()
	if !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("got %v, want deadline exceeded", err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("timeout took %v", d)
	}
}

func TestReaderRenewsDeadlinePerRead(t *testing.T) {
	c, client := pipe(t, Options{MaxLine: 100, ReadTimeout: 50 * time.Millisecond})
	c.SetReadTimeout(10 * time.Second)
	if c.ReadTimeout() != 10*time.Second {
		t.Fatal("SetReadTimeout not applied")
	}
	go func() { _, _ = io.WriteString(client, "body bytes") }()
	buf := make([]byte, 10)
	if _, err := io.ReadFull(c.Reader(), buf); err != nil || string(buf) != "body bytes" {
		t.Fatalf("got %q, %v", buf, err)
	}
	c.SetReadTimeout(50 * time.Millisecond)
	if _, err := c.Reader().ReadByte(); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("got %v, want deadline exceeded", err)
	}
}

func TestRenewDeadline(t *testing.T) {
	const timeout = time.Hour // the microseconds between calls do not matter
	var last time.Time
	d, ok := renew(&last, timeout)
	if !ok || !last.Equal(d) || time.Until(d) < timeout-time.Minute {
		t.Fatalf("first: %v %v, last %v", d, ok, last)
	}
	if _, ok := renew(&last, timeout); ok {
		t.Fatal("renewed a deadline set just now")
	}
	for _, c := range []struct {
		name string
		last time.Time
		want bool
	}{
		{"1/64 of the timeout ago", time.Now().Add(timeout - timeout/64), false},
		{"1/16 of the timeout ago", time.Now().Add(timeout - timeout/16), true},
		{"later than the timeout allows", time.Now().Add(2 * timeout), true},
		{"in the past", time.Unix(1, 0), true},
	} {
		last = c.last
		d, ok := renew(&last, timeout)
		if ok != c.want {
			t.Errorf("%s: renewed %v, want %v", c.name, ok, c.want)
		}
		if ok && (!last.Equal(d) || time.Until(d) < timeout-time.Minute) {
			t.Errorf("%s: got %v, last %v", c.name, d, last)
		}
		if !ok && !last.Equal(c.last) {
			t.Errorf("%s: last moved to %v", c.name, last)
		}
	}
}

// A timeout shortened after a longer one was set applies at once: the
// deadline is not left at the longer one.
func TestReadLineTimeoutAfterLongerDeadline(t *testing.T) {
	c, client := pipe(t, Options{MaxLine: 100, ReadTimeout: time.Hour})
	go func() { _, _ = io.WriteString(client, "first\r\n") }()
	if line, err := c.ReadLine(); err != nil || string(line) != "first" {
		t.Fatalf("got %q, %v", line, err)
	}
	c.SetReadTimeout(50 * time.Millisecond)
	if _, err := c.ReadLine(); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("got %v, want deadline exceeded", err)
	}
}

func TestWriteFlushAndBuffered(t *testing.T) {
	c, client := pipe(t, Options{MaxLine: 100, ReadTimeout: 10 * time.Second, WriteTimeout: 10 * time.Second})
	if c.RemoteAddr().Addr().String() != "127.0.0.1" || c.LocalAddr().Port() == 0 {
		t.Fatalf("addresses: %v %v", c.RemoteAddr(), c.LocalAddr())
	}
	_, _ = io.WriteString(client, "one\r\ntwo\r\nthr")
	if _, err := c.ReadLine(); err != nil {
		t.Fatal(err)
	}
	// All 14 bytes arrived in one segment on loopback, but that is not
	// guaranteed: read "two" first, after which only "thr" may remain.
	if _, err := c.ReadLine(); err != nil {
		t.Fatal(err)
	}
	if c.HasLine() {
		t.Fatal("HasLine with only a partial line buffered")
	}
	_, _ = io.WriteString(client, "ee\r\n")
	if l, err := c.ReadLine(); err != nil || string(l) != "three" {
		t.Fatalf("got %q, %v", l, err)
	}
	if c.Buffered() != 0 || c.HasLine() {
		t.Fatal("input left buffered")
	}
	if _, err := c.WriteString("hello "); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Write([]byte("world\r\n")); err != nil {
		t.Fatal(err)
	}
	if err := c.Flush(); err != nil {
		t.Fatal(err)
	}
	got, err := bufio.NewReader(client).ReadString('\n')
	if err != nil || got != "hello world\r\n" {
		t.Fatalf("client got %q, %v", got, err)
	}
}

// testTLS returns a server config with a fresh self-signed certificate for
// "localhost" and a client config trusting it.
func testTLS(t testing.TB) (server, client *tls.Config) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1),
		Subject:      pkix.Name{CommonName: "localhost"},
		DNSNames:     []string{"localhost"},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(cert)
	return &tls.Config{Certificates: []tls.Certificate{{Certificate: [][]byte{der}, PrivateKey: key}}},
		&tls.Config{RootCAs: pool, ServerName: "localhost"}
}

func TestStartTLSDiscardsPipelinedPlaintext(t *testing.T) {
	srvCfg, cliCfg := testTLS(t)
	c, client := pipe(t, Options{MaxLine: 100, ReadTimeout: 10 * time.Second, WriteTimeout: 10 * time.Second})
	// The injected line arrives with STARTTLS, before the handshake: it must
	// not be executed inside the TLS session (CVE-2011-0411).
	if _, err := io.WriteString(client, "STARTTLS\r\nINJECTED\r\n"); err != nil {
		t.Fatal(err)
	}
	errc := make(chan error, 1)
	go func() {
		br := bufio.NewReader(client)
		if l, err := br.ReadString('\n'); err != nil || l != "220 go\r\n" {
			errc <- errors.New("bad reply: " + l)
			return
		}
		tc := tls.Client(client, cliCfg)
		if err := tc.Handshake(); err != nil {
			errc <- err
			return
		}
		_, err := io.WriteString(tc, "SECURE\r\n")
		errc <- err
	}()
	if l, err := c.ReadLine(); err != nil || string(l) != "STARTTLS" {
		t.Fatalf("got %q, %v", l, err)
	}
	if c.TLS() != nil {
		t.Fatal("TLS state before handshake")
	}
	_, _ = c.WriteString("220 go\r\n")
	if err := c.Flush(); err != nil {
		t.Fatal(err)
	}
	if err := c.StartTLS(srvCfg); err != nil {
		t.Fatal(err)
	}
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	if c.TLS() == nil || !c.TLS().HandshakeComplete {
		t.Fatal("no TLS state after handshake")
	}
	if l, err := c.ReadLine(); err != nil || string(l) != "SECURE" {
		t.Fatalf("first line after TLS: %q, %v", l, err)
	}
	if err := c.StartTLS(srvCfg); err == nil {
		t.Fatal("second StartTLS succeeded")
	}
}

func TestStartTLSHandshakeTimeout(t *testing.T) {
	srvCfg, _ := testTLS(t)
	c, _ := pipe(t, Options{MaxLine: 100, HandshakeTimeout: 50 * time.Millisecond})
	// The client never sends a ClientHello.
	err := c.StartTLS(srvCfg)
	if !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("got %v, want deadline exceeded", err)
	}
}

func TestStartTLSRequiresFlushedOutput(t *testing.T) {
	srvCfg, _ := testTLS(t)
	c, _ := pipe(t, Options{MaxLine: 100})
	_, _ = c.WriteString("unflushed")
	if err := c.StartTLS(srvCfg); err == nil {
		t.Fatal("StartTLS with buffered output succeeded")
	}
}

func TestWatchShutdownWakesIdleReader(t *testing.T) {
	c, client := pipe(t, Options{MaxLine: 100, ReadTimeout: time.Minute})
	shutdown := make(chan struct{})
	stop := c.WatchShutdown(shutdown)
	defer stop()
	_, _ = io.WriteString(client, "queued\r\n")
	if l, err := c.ReadLine(); err != nil || string(l) != "queued" {
		t.Fatalf("got %q, %v", l, err)
	}
	errc := make(chan error, 1)
	go func() {
		_, err := c.ReadLine()
		errc <- err
	}()
	close(shutdown)
	if err := <-errc; !errors.Is(err, ErrShutdown) {
		t.Fatalf("got %v, want ErrShutdown", err)
	}
	if _, err := c.ReadLine(); !errors.Is(err, ErrShutdown) {
		t.Fatalf("second read: %v, want ErrShutdown", err)
	}
}

func TestWatchShutdownServesBufferedLines(t *testing.T) {
	c, client := pipe(t, Options{MaxLine: 100, ReadTimeout: time.Minute})
	_, _ = io.WriteString(client, "a\r\nb\r\n")
	if l, err := c.ReadLine(); err != nil || string(l) != "a" {
		t.Fatalf("got %q, %v", l, err)
	}
	shutdown := make(chan struct{})
	close(shutdown)
	stop := c.WatchShutdown(shutdown)
	defer stop()
	// Whether or not the watcher goroutine has run yet, "b" is served and
	// the read after it fails with ErrShutdown rather than blocking.
	var lines []string
	for {
		l, err := c.ReadLine()
		if errors.Is(err, ErrShutdown) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		lines = append(lines, string(l))
		if len(lines) > 1 {
			t.Fatalf("read %q after shutdown", lines)
		}
	}
	if len(lines) != 1 || lines[0] != "b" {
		t.Fatalf("lines %q", lines)
	}
}

// Unix-socket peers have no IP: they must not share one per-IP slot count.
func TestLimiterPeersWithoutIP(t *testing.T) {
	l := NewLimiter(1, 3)
	var releases []func()
	for i := 0; i < 3; i++ {
		release, ok := l.Acquire(netip.Addr{})
		if !ok {
			t.Fatalf("connection %d without IP refused under the total limit", i)
		}
		releases = append(releases, release)
	}
	if _, ok := l.Acquire(netip.Addr{}); ok {
		t.Fatal("total limit not applied to peers without IP")
	}
	releases[0]()
	releases[0]() // idempotent
	if _, ok := l.Acquire(netip.Addr{}); !ok {
		t.Fatal("slot not released")
	}
}

// sent returns the bytes m counted as sent.
func sent(m *Metrics) float64 {
	var d dto.Metric
	_ = m.bytesOut.Write(&d)
	return value(&d)
}

// GrowWriteBuffer sends what was buffered before it, then holds a burst
// larger than the initial buffer until Flush, which sends it in order.
func TestGrowWriteBuffer(t *testing.T) {
	m := NewMetrics(nil, "grow")
	c, client := pipe(t, Options{WriteTimeout: 10 * time.Second, Metrics: m})
	_, _ = c.WriteString("first\r\n")
	if err := c.GrowWriteBuffer(64 << 10); err != nil {
		t.Fatal(err)
	}
	if got := sent(m); got != 7 {
		t.Fatalf("%v bytes sent by GrowWriteBuffer, want the 7 buffered", got)
	}
	burst := strings.Repeat("x", 40<<10) + "\r\n"
	_, _ = c.WriteString(burst)
	if got := sent(m); got != 7 {
		t.Fatalf("%v bytes sent before Flush, want 7", got)
	}
	if err := c.GrowWriteBuffer(1024); err != nil || sent(m) != 7 {
		t.Fatalf("a smaller size changed the buffer: %v", err)
	}
	if err := c.Flush(); err != nil {
		t.Fatal(err)
	}
	r := bufio.NewReaderSize(client, 64<<10)
	for _, want := range []string{"first\r\n", burst} {
		if got, err := r.ReadString('\n'); err != nil || got != want {
			t.Fatalf("client got %d bytes, %v; want %d", len(got), err, len(want))
		}
	}
}

// A released Conn's buffers go to the next Conn of the same sizes, which
// must see none of its unread input or unflushed output.
func TestReleaseDiscardsState(t *testing.T) {
	opts := Options{MaxLine: 5000, ReadTimeout: 10 * time.Second, WriteTimeout: 10 * time.Second}
	const grown = 48 << 10
	// sync.Pool may drop what it holds at any collection, or hand out
	// another released buffer: try until the next Conn gets both.
	for try := 0; try < 20; try++ {
		a, clientA := pipe(t, opts)
		if _, err := clientA.Write([]byte("one\r\ntwo\r\n")); err != nil {
			t.Fatal(err)
		}
		if line, err := a.ReadLine(); err != nil || string(line) != "one" {
			t.Fatalf("ReadLine = %q, %v", line, err)
		}
		if err := a.GrowWriteBuffer(grown); err != nil {
			t.Fatal(err)
		}
		_, _ = a.WriteString("stale\r\n")
		oldR, oldW := a.br, a.bw
		a.Release()

		b, clientB := pipe(t, opts)
		if err := b.GrowWriteBuffer(grown); err != nil {
			t.Fatal(err)
		}
		reused := b.br == oldR && b.bw == oldW
		if _, err := clientB.Write([]byte("three\r\n")); err != nil {
			t.Fatal(err)
		}
		if line, err := b.ReadLine(); err != nil || string(line) != "three" {
			t.Fatalf("ReadLine = %q, %v; want the new connection's line", line, err)
		}
		_, _ = b.WriteString("fresh\r\n")
		if err := b.Flush(); err != nil {
			t.Fatal(err)
		}
		got, err := bufio.NewReader(clientB).ReadString('\n')
		if err != nil || got != "fresh\r\n" {
			t.Fatalf("client got %q, %v; want only the new connection's output", got, err)
		}
		b.Release()
		if reused {
			return
		}
	}
	t.Skip("the pool never handed the released buffers back")
}
