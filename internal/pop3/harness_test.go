package pop3

import (
	"bufio"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"io"
	"log/slog"
	"math/big"
	"net"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"
)

// testCert is a self-signed certificate for "localhost" and 127.0.0.1,
// made once per test binary.
var testCert = sync.OnceValues(func() (tls.Certificate, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return tls.Certificate{}, err
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "localhost"},
		DNSNames:              []string{"localhost"},
		IPAddresses:           []net.IP{net.IPv4(127, 0, 0, 1)},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(24 * time.Hour),
		KeyUsage:              x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return tls.Certificate{}, err
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		return tls.Certificate{}, err
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key, Leaf: leaf}, nil
})

// tlsConfigs returns the server config and a client config that trusts it.
func tlsConfigs(t testing.TB) (server, client *tls.Config) {
	t.Helper()
	cert, err := testCert()
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(cert.Leaf)
	return &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12},
		&tls.Config{RootCAs: pool, ServerName: "localhost", MinVersion: tls.VersionTLS12}
}

// testCertPEM returns the test certificate in PEM, for external clients.
func testCertPEM(t testing.TB) []byte {
	cert, err := testCert()
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: cert.Leaf.Raw})
}

// fakeRemoteListener makes accepted connections report remote as their
// peer address, so that tests on loopback can act as a remote client.
type fakeRemoteListener struct {
	net.Listener
	remote netip.Addr
}

func (l fakeRemoteListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return fakeRemoteConn{c, net.TCPAddrFromAddrPort(netip.AddrPortFrom(l.remote, 40000))}, nil
}

type fakeRemoteConn struct {
	net.Conn
	remote net.Addr
}

func (c fakeRemoteConn) RemoteAddr() net.Addr { return c.remote }

// testLogger logs through t, so that a failing test shows the server's log.
func testLogger(t testing.TB) *slog.Logger {
	return slog.New(slog.NewTextHandler(tWriter{t}, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

type tWriter struct{ t testing.TB }

func (w tWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimSuffix(string(p), "\n"))
	return len(p), nil
}

// startServer serves srv on a fresh 127.0.0.1 port (seen as remote, if
// valid) and stops it when the test ends, requiring a clean Shutdown.
func startServer(t testing.TB, srv *Server, remote netip.Addr) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var l net.Listener = ln
	if remote.IsValid() {
		l = fakeRemoteListener{ln, remote}
	}
	return serveListener(t, srv, l)
}

// serveListener serves srv on l and stops it when the test ends, requiring
// a clean Shutdown.
func serveListener(t testing.TB, srv *Server, l net.Listener) string {
	t.Helper()
	addr := l.Addr().String()
	served := make(chan error, 1)
	go func() { served <- srv.Serve(l) }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := srv.Shutdown(ctx); err != nil {
			t.Errorf("Shutdown: %v", err)
		}
		if err := <-served; !errors.Is(err, ErrServerClosed) {
			t.Errorf("Serve returned %v", err)
		}
	})
	return addr
}

// fixture returns the backend every golden transcript starts from.
func fixture() *memBackend {
	b := newMemBackend()
	b.addUser("alice", "secret",
		memMessage{uid: "uid-1", body: "From: bob@example.org\r\nTo: alice@example.org\r\nSubject: hello\r\n\r\nHi Alice,\r\nhow are you?\r\n"},
		memMessage{uid: "uid-2", body: "Subject: dots\r\n\r\n.leading dot\r\n..two dots\r\n.\r\nend\r\n"},
		memMessage{uid: "uid-3", body: "Subject: third\r\n\r\nline 1\r\nline 2\r\nline 3\r\nline 4\r\nline 5\r\n"},
	)
	b.addUser("bob", "hunter2")
	b.addUser("carol", "correct horse battery", memMessage{uid: "c-1", body: "Subject: x\r\n\r\ny\r\n"})
	b.addUser("dave", "pw",
		memMessage{uid: "d-1", body: "Subject: fails\r\n\r\n" + strings.Repeat("a long line\r\n", 1000), failAt: 6000},
		memMessage{uid: "d-2", body: "Subject: ok\r\n\r\nok\r\n"},
	)
	b.addUser("erin", "pw", memMessage{uid: "e-1", body: "Subject: x\r\n\r\ny\r\n"}).failCommit = true
	return b
}

// client is the test side of one POP3 connection.
type client struct {
	t    testing.TB
	conn net.Conn
	r    *bufio.Reader
}

func dial(t testing.TB, addr string, tlsCfg *tls.Config) *client {
	t.Helper()
	nc, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	if tlsCfg != nil {
		nc = tls.Client(nc, tlsCfg)
	}
	c := &client{t: t, conn: nc, r: bufio.NewReader(nc)}
	t.Cleanup(func() { c.conn.Close() })
	// A deadline, not a sleep: a hung server fails the test instead of
	// hanging it.
	_ = nc.SetDeadline(time.Now().Add(20 * time.Second))
	return c
}

func (c *client) send(line string) {
	c.t.Helper()
	if _, err := io.WriteString(c.conn, line+"\r\n"); err != nil {
		c.t.Fatalf("send %q: %v", line, err)
	}
}

// readLine returns one line without CRLF, or "<EOF>" if the server closed
// the connection.
func (c *client) readLine() string {
	c.t.Helper()
	line, err := c.r.ReadString('\n')
	if err != nil {
		if line == "" && (errors.Is(err, io.EOF) || errors.Is(err, net.ErrClosed) || isReset(err)) {
			return "<EOF>"
		}
		c.t.Fatalf("read: %q, %v", line, err)
	}
	if !strings.HasSuffix(line, "\r\n") {
		c.t.Fatalf("line without CRLF: %q", line)
	}
	return strings.TrimSuffix(line, "\r\n")
}

func isReset(err error) bool {
	var op *net.OpError
	return errors.As(err, &op) && strings.Contains(op.Err.Error(), "reset")
}

// response reads the response to cmd: the status line and, for a +OK to
// a multi-line command (RFC 1939 section 3), the lines through ".".
func (c *client) response(cmd string) []string {
	c.t.Helper()
	status := c.readLine()
	lines := []string{status}
	if !strings.HasPrefix(status, "+OK") || !multiline(cmd) {
		return lines
	}
	for {
		l := c.readLine()
		lines = append(lines, l)
		if l == "." || l == "<EOF>" {
			return lines
		}
	}
}

// multiline reports whether a +OK reply to the command line is multi-line.
func multiline(line string) bool {
	cmd, err := ParseCommand([]byte(line))
	if err != nil {
		return false
	}
	switch cmd.Name {
	case "CAPA", "RETR", "TOP":
		return true
	case "LIST", "UIDL", "AUTH":
		return len(cmd.Args) == 0
	}
	return false
}

// startTLS runs the client side of STLS.
func (c *client) startTLS(cfg *tls.Config) {
	c.t.Helper()
	if c.r.Buffered() != 0 {
		c.t.Fatalf("%d octets after STLS response", c.r.Buffered())
	}
	tc := tls.Client(c.conn, cfg)
	if err := tc.Handshake(); err != nil {
		c.t.Fatalf("TLS handshake: %v", err)
	}
	c.conn = tc
	c.r = bufio.NewReader(tc)
}

// netipAddr parses s; "" is the zero Addr (no fake remote).
func netipAddr(s string) netip.Addr {
	if s == "" {
		return netip.Addr{}
	}
	return netip.MustParseAddr(s)
}

// lockedBuffer is a bytes.Buffer safe for concurrent writers.
type lockedBuffer struct {
	mu  sync.Mutex
	buf strings.Builder
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}
