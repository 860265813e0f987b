package imap

import (
	"bufio"
	"compress/flate"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"io"
	"log/slog"
	"math/big"
	"net"
	"net/netip"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"quill/internal/auth"
	"quill/internal/mailbox"
	"quill/internal/store"
	"quill/internal/store/embedded"
	"quill/internal/usermgr"
)

// testCert is a self-signed certificate for "localhost", made once.
var testCert = sync.OnceValues(func() (tls.Certificate, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return tls.Certificate{}, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "localhost"},
		DNSNames: []string{"localhost"}, IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		KeyUsage:    x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}, BasicConstraintsValid: true, IsCA: true,
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

func testLogger(t testing.TB) *slog.Logger {
	return slog.New(slog.NewTextHandler(tWriter{t}, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

type tWriter struct{ t testing.TB }

func (w tWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimSuffix(string(p), "\n"))
	return len(p), nil
}

// fakeRemoteListener makes accepted connections report remote as their
// peer, so that tests on loopback can act as a remote client.
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

// testBackend is the real mailbox service over the real user manager and
// embedded engine, with plain-text test passwords instead of the KDF.
type testBackend struct {
	st        *usermgr.Manager
	hub       *mailbox.Hub
	events    *mutableNotifier
	mbx       *mailbox.Mailboxes
	passwords map[string]string
}

// mutableNotifier passes the manager's change events to the hub, except
// while muted: writes made then look like another node's, whose events
// this node's hub never hears (only polling finds them).
type mutableNotifier struct {
	hub   *mailbox.Hub
	muted atomic.Bool
}

func (n *mutableNotifier) Notify(id store.ID) {
	if !n.muted.Load() {
		n.hub.Notify(id)
	}
}

func (b *testBackend) Authenticate(ctx context.Context, username, password string, remote netip.Addr) (string, error) {
	if p, ok := b.passwords[username]; ok && p == password {
		return username, nil
	}
	return "", auth.ErrInvalidCredentials
}

func (b *testBackend) Mailboxes(ctx context.Context, user string) (Mailboxes, error) {
	return testUser{b.mbx.User(user)}, nil
}

type testUser struct{ *mailbox.User }

func (u testUser) Select(ctx context.Context, name string, readOnly bool) (View, mailbox.SelectInfo, error) {
	v, info, err := u.User.Select(ctx, name, readOnly)
	if err != nil {
		return nil, info, err
	}
	return v, info, nil
}

// fixtureDate is the internal date of fixture messages.
var fixtureDate = time.Date(2024, 3, 1, 12, 0, 0, 0, time.FixedZone("", 3600))

// newTestBackend opens an engine on a temp dir with users alice (three
// INBOX messages) and bob (empty), with the default folders.
func newTestBackend(t testing.TB) *testBackend {
	t.Helper()
	return newTestBackendWith(t, embedded.Options{})
}

func newTestBackendWith(t testing.TB, opts embedded.Options) *testBackend {
	t.Helper()
	e, err := embedded.Open(t.TempDir(), opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	return newTestBackendOn(t, e)
}

// newTestBackendOn is newTestBackend over an open engine e (the embedded
// one, or a fault injector around it), which the caller closes.
func newTestBackendOn(t testing.TB, e store.Engine) *testBackend {
	t.Helper()
	hub := mailbox.NewHub()
	events := &mutableNotifier{hub: hub}
	st := usermgr.New(e, usermgr.Options{Notifier: events})
	b := &testBackend{st: st, hub: hub, events: events, mbx: mailbox.NewMailboxes(st, hub),
		passwords: map[string]string{"alice": "secret", "bob": "hunter2"}}
	ctx := context.Background()
	for user := range b.passwords {
		if err := st.CreateUser(ctx, store.User{Address: user}); err != nil {
			t.Fatal(err)
		}
		for _, m := range auth.DefaultMailboxes {
			if _, err := st.CreateMailbox(ctx, user, m.Name, store.MailboxOptions{SpecialUse: m.SpecialUse, Subscribed: true}); err != nil {
				t.Fatal(err)
			}
		}
	}
	b.deliver(t, "alice", "From: Bob <bob@example.org>\r\nTo: alice@example.org\r\nSubject: hello\r\nDate: Fri, 1 Mar 2024 11:00:00 +0000\r\n\r\nHi Alice,\r\nhow are you?\r\n")
	b.deliver(t, "alice", "From: carol@example.org\r\nTo: alice@example.org\r\nSubject: lunch\r\nDate: Sat, 2 Mar 2024 11:00:00 +0000\r\n\r\nPizza at noon?\r\n")
	b.deliver(t, "alice", "From: dave@example.org\r\nTo: alice@example.org\r\nSubject: report\r\nDate: Sun, 3 Mar 2024 11:00:00 +0000\r\n\r\nThe quarterly REPORT is attached.\r\n")
	return b
}

// deliver appends body to user's INBOX as SMTP delivery does; the manager
// notifies the hub.
func (b *testBackend) deliver(t testing.TB, user, body string) {
	t.Helper()
	b.appendInbox(t, user, body)
}

// deliverElsewhere appends body to user's INBOX without telling the hub,
// as a delivery through another node would.
func (b *testBackend) deliverElsewhere(t testing.TB, user, body string) (store.ID, []store.Message) {
	t.Helper()
	b.events.muted.Store(true)
	defer b.events.muted.Store(false)
	return b.appendInbox(t, user, body)
}

func (b *testBackend) appendInbox(t testing.TB, user, body string) (store.ID, []store.Message) {
	t.Helper()
	ctx := context.Background()
	inbox, err := b.st.GetMailbox(ctx, user, "INBOX")
	if err != nil {
		t.Fatal(err)
	}
	id, n, err := b.st.PutBlob(ctx, strings.NewReader(body), 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	msgs, err := b.st.Append(ctx, inbox.ID, []store.NewMessage{{Blob: id, Size: n, InternalDate: fixtureDate}}, store.AppendOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return inbox.ID, msgs
}

// churn delivers n messages to user's INBOX and expunges each at once,
// as POP3 retrieval through another node does, without telling the hub.
func (b *testBackend) churn(t testing.TB, user string, n int) {
	t.Helper()
	b.events.muted.Store(true)
	defer b.events.muted.Store(false)
	for range n {
		inbox, msgs := b.appendInbox(t, user, "Subject: churn\r\n\r\nbody\r\n")
		if _, _, err := b.st.Expunge(context.Background(), inbox, []uint32{msgs[0].UID}); err != nil {
			t.Fatal(err)
		}
	}
}

// setQuota sets user's quota in octets, as the operator does.
func (b *testBackend) setQuota(t testing.TB, user string, octets int64) {
	t.Helper()
	ctx := context.Background()
	u, err := b.st.GetUser(ctx, user)
	if err != nil {
		t.Fatal(err)
	}
	u.QuotaBytes = octets
	if err := b.st.UpdateUser(ctx, u); err != nil {
		t.Fatal(err)
	}
}

// startServer serves srv on 127.0.0.1:0 (seen as remote if valid) and
// stops it when the test ends, requiring a clean Shutdown.
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

// repeatRE is {x*N} in C: lines: N octets "x".
var repeatRE = regexp.MustCompile(`\{(.)\*([0-9]+)\}`)

// client is the test side of one IMAP connection.
type client struct {
	t    testing.TB
	conn net.Conn
	r    *bufio.Reader
	// contTag is the tag of a command waiting for its literal or for
	// DONE; the next line sent continues it.
	contTag string
	last    string // the last line sent, for failure messages
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
	// A deadline, not a sleep: a hung server fails the test.
	_ = nc.SetDeadline(time.Now().Add(30 * time.Second))
	return c
}

func (c *client) send(s string) {
	c.t.Helper()
	if _, err := io.WriteString(c.conn, s); err != nil {
		c.t.Fatalf("send %q: %v", s, err)
	}
}

// readLine returns one response line without CRLF, or "<EOF>". A literal
// at the end of the line is read with the line; the returned lines then
// hold the literal's content split at CRLF.
func (c *client) readLines() []string {
	c.t.Helper()
	line, err := c.r.ReadString('\n')
	if err != nil {
		if line == "" && (errors.Is(err, io.EOF) || errors.Is(err, net.ErrClosed) || strings.Contains(err.Error(), "reset")) {
			return []string{"<EOF>"}
		}
		c.t.Fatalf("read after %q: %q, %v", c.last, line, err)
	}
	if !strings.HasSuffix(line, "\r\n") {
		c.t.Fatalf("line without CRLF: %q", line)
	}
	line = strings.TrimSuffix(line, "\r\n")
	out := []string{}
	for strings.HasSuffix(line, "}") {
		i := strings.LastIndexByte(line, '{')
		if i < 0 {
			break
		}
		n, err := strconv.Atoi(line[i+1 : len(line)-1])
		if err != nil {
			break
		}
		buf := make([]byte, n)
		if _, err := io.ReadFull(c.r, buf); err != nil {
			c.t.Fatalf("reading literal: %v", err)
		}
		parts := strings.Split(line+"\r\n"+string(buf), "\r\n")
		out = append(out, parts[:len(parts)-1]...)
		rest, err := c.r.ReadString('\n')
		if err != nil {
			c.t.Fatalf("read after literal: %v", err)
		}
		line = parts[len(parts)-1] + strings.TrimSuffix(rest, "\r\n")
	}
	return append(out, line)
}

// response sends cmd and reads the response: through the tagged line, a
// continuation request, or EOF.
func (c *client) command(cmd string) []string {
	c.t.Helper()
	tag := c.contTag
	if tag == "" {
		tag, _, _ = strings.Cut(cmd, " ")
	}
	cmd = repeatRE.ReplaceAllStringFunc(cmd, func(s string) string {
		r := repeatRE.FindStringSubmatch(s)
		n, _ := strconv.Atoi(r[2])
		return strings.Repeat(r[1], n)
	})
	c.send(strings.ReplaceAll(cmd, "<CRLF>", "\r\n") + "\r\n")
	c.last = cmd
	if strings.HasSuffix(cmd, "+}") {
		c.contTag = tag
		return nil
	}
	c.contTag = ""
	var out []string
	for {
		lines := c.readLines()
		out = append(out, lines...)
		last := lines[len(lines)-1]
		switch {
		case last == "<EOF>", strings.HasPrefix(last, tag+" "):
			return out
		case strings.HasPrefix(last, "* BAD"):
			return out
		case strings.HasPrefix(last, "+"):
			c.contTag = tag
			return out
		}
	}
}

// compress starts COMPRESS=DEFLATE (RFC 4978) on the client side, after
// the server's OK: raw deflate both ways, each send flushed at once.
func (c *client) compress() {
	c.t.Helper()
	if c.r.Buffered() != 0 {
		c.t.Fatalf("%d octets after COMPRESS response", c.r.Buffered())
	}
	w, err := flate.NewWriter(c.conn, flate.DefaultCompression)
	if err != nil {
		c.t.Fatal(err)
	}
	dc := &deflateClientConn{Conn: c.conn, r: flate.NewReader(c.conn), w: w}
	c.conn = dc
	c.r = bufio.NewReader(dc)
}

// deflateClientConn is a client connection under COMPRESS=DEFLATE.
type deflateClientConn struct {
	net.Conn
	r io.Reader
	w *flate.Writer
}

func (d *deflateClientConn) Read(p []byte) (int, error) { return d.r.Read(p) }

func (d *deflateClientConn) Write(p []byte) (int, error) {
	n, err := d.w.Write(p)
	if err == nil {
		err = d.w.Flush()
	}
	return n, err
}

func (c *client) startTLS(cfg *tls.Config) {
	c.t.Helper()
	if c.r.Buffered() != 0 {
		c.t.Fatalf("%d octets after STARTTLS response", c.r.Buffered())
	}
	tc := tls.Client(c.conn, cfg)
	if err := tc.Handshake(); err != nil {
		c.t.Fatalf("TLS handshake: %v", err)
	}
	c.conn = tc
	c.r = bufio.NewReader(tc)
}
