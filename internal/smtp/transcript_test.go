package smtp

import (
	"bufio"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"flag"
	"io"
	"log/slog"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"quill/internal/textconn"
)

var update = flag.Bool("update", false, "rewrite the S: lines of testdata/*.txt with the server's replies")

// testTLS returns a server config with a fresh self-signed certificate for
// mx.example.org and a client config trusting it.
func testTLS(t testing.TB) (server, client *tls.Config) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1),
		Subject:      pkix.Name{CommonName: "mx.example.org"},
		DNSNames:     []string{"mx.example.org"},
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
		&tls.Config{RootCAs: pool, ServerName: "mx.example.org"}
}

// testLogger writes server logs through t.Log.
func testLogger(t testing.TB) *slog.Logger {
	return slog.New(slog.NewTextHandler(tWriter{t}, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

type tWriter struct{ t testing.TB }

func (w tWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// remoteListener makes accepted connections report a fixed remote address,
// so tests on 127.0.0.1 can play a non-loopback client.
type remoteListener struct {
	net.Listener
	remote net.Addr
}

func (l remoteListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return remoteConn{c, l.remote}, nil
}

type remoteConn struct {
	net.Conn
	remote net.Addr
}

func (c remoteConn) RemoteAddr() net.Addr { return c.remote }

// startServer serves srv on a loopback port and stops it when the test
// ends, failing the test if Shutdown does not complete cleanly.
func startServer(t testing.TB, srv *Server, remote net.Addr) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	if remote != nil {
		ln = remoteListener{ln, remote}
	}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := srv.Shutdown(ctx); err != nil {
			t.Errorf("Shutdown: %v", err)
		}
		if err := <-errc; !errors.Is(err, textconn.ErrServerClosed) {
			t.Errorf("Serve: %v", err)
		}
	})
	return addr
}

func newTestServer(t testing.TB, b Backend) *Server {
	return &Server{
		Mode:     ModeMX,
		Hostname: "mx.example.org",
		Backend:  b,
		Logger:   testLogger(t),
		Now:      func() time.Time { return time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC) },
	}
}

// TestTranscripts runs testdata/*.txt. A file starts with "!" directives
// configuring the server, then alternates C: lines (sent, consecutive ones
// in one write: pipelining) and S: lines (expected replies; as many replies
// are read as the block has final lines). "${600*x}" in a C: line expands to
// 600 x's. Directives after the start: "! starttls" (client TLS handshake),
// "! eof" (the server must close), "! shutdown" (begin a graceful server
// shutdown), "! delivered N" (messages the backend has stored).
func TestTranscripts(t *testing.T) {
	files, err := filepath.Glob("testdata/*.txt")
	if err != nil || len(files) == 0 {
		t.Fatalf("no transcripts: %v", err)
	}
	for _, f := range files {
		t.Run(strings.TrimSuffix(filepath.Base(f), ".txt"), func(t *testing.T) {
			runTranscript(t, f)
		})
	}
}

var repeatRE = regexp.MustCompile(`\$\{(\d+)\*(.)\}`)

func expand(s string) string {
	return repeatRE.ReplaceAllStringFunc(s, func(m string) string {
		sub := repeatRE.FindStringSubmatch(m)
		n, _ := strconv.Atoi(sub[1])
		return strings.Repeat(sub[2], n)
	})
}

func runTranscript(t *testing.T, path string) {
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimRight(string(raw), "\n"), "\n")
	backend := &testBackend{}
	srv := newTestServer(t, backend)
	serverTLS, clientTLS := testTLS(t)
	var remote net.Addr
	started := false
	var out []string

	var conn net.Conn
	var br *bufio.Reader
	shutdownDone := make(chan error, 1)
	shuttingDown := false

	start := func() {
		started = true
		addr := startServer(t, srv, remote)
		var err error
		if srv.ImplicitTLS {
			conn, err = tls.Dial("tcp", addr, clientTLS)
		} else {
			conn, err = net.Dial("tcp", addr)
		}
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.Close() })
		br = bufio.NewReader(conn)
	}

	for i := 0; i < len(lines); i++ {
		line := lines[i]
		switch {
		case line == "" || strings.HasPrefix(line, "#"):
			out = append(out, line)
		case strings.HasPrefix(line, "!"):
			out = append(out, line)
			f := strings.Fields(strings.TrimPrefix(line, "!"))
			if !started {
				configure(t, srv, f, serverTLS, &remote)
				continue
			}
			switch f[0] {
			case "starttls":
				tc := tls.Client(conn, clientTLS)
				if err := tc.Handshake(); err != nil {
					t.Fatalf("line %d: TLS handshake: %v", i+1, err)
				}
				conn, br = tc, bufio.NewReader(tc)
			case "eof":
				_ = conn.SetReadDeadline(time.Now().Add(10 * time.Second))
				if b, err := br.ReadByte(); err == nil {
					rest, _ := br.ReadString('\n')
					t.Errorf("line %d: want EOF, got %q", i+1, string(b)+rest)
				}
			case "shutdown":
				shuttingDown = true
				go func() {
					ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
					defer cancel()
					shutdownDone <- srv.Shutdown(ctx)
				}()
			case "delivered":
				n, _ := strconv.Atoi(f[1])
				if got := len(backend.delivered()); got != n {
					t.Errorf("line %d: %d messages delivered, want %d", i+1, got, n)
				}
			default:
				t.Fatalf("line %d: unknown directive %q", i+1, line)
			}
		case strings.HasPrefix(line, "C: "):
			if !started {
				start()
			}
			var buf strings.Builder
			for ; i < len(lines) && strings.HasPrefix(lines[i], "C: "); i++ {
				out = append(out, lines[i])
				buf.WriteString(expand(strings.TrimPrefix(lines[i], "C: ")) + "\r\n")
			}
			i--
			_ = conn.SetWriteDeadline(time.Now().Add(10 * time.Second))
			if _, err := io.WriteString(conn, buf.String()); err != nil {
				t.Fatalf("line %d: write: %v", i+1, err)
			}
		case strings.HasPrefix(line, "S: "):
			if !started {
				start()
			}
			var want []string
			for ; i < len(lines) && strings.HasPrefix(lines[i], "S: "); i++ {
				want = append(want, strings.TrimPrefix(lines[i], "S: "))
			}
			i--
			replies := 0
			for _, w := range want {
				if len(w) < 4 || w[3] == ' ' {
					replies++
				}
			}
			got := readReplies(t, conn, br, replies)
			for _, g := range got {
				out = append(out, "S: "+g)
			}
			if !*update && strings.Join(got, "\n") != strings.Join(want, "\n") {
				t.Errorf("line %d: replies differ\n got: %q\nwant: %q", i+1, got, want)
			}
		default:
			t.Fatalf("line %d: cannot parse %q", i+1, line)
		}
	}
	conn.Close()
	if shuttingDown {
		if err := <-shutdownDone; err != nil {
			t.Errorf("Shutdown: %v", err)
		}
	}
	if *update {
		if err := os.WriteFile(path, []byte(strings.Join(out, "\n")+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

func configure(t *testing.T, srv *Server, f []string, serverTLS *tls.Config, remote *net.Addr) {
	arg := func() int {
		if len(f) < 2 {
			t.Fatalf("directive %q needs a value", f[0])
		}
		n, err := strconv.Atoi(f[1])
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	switch f[0] {
	case "mode":
		srv.Mode = map[string]Mode{"mx": ModeMX, "submission": ModeSubmission, "lmtp": ModeLMTP}[f[1]]
	case "tls":
		srv.TLSConfig = serverTLS
	case "implicit-tls":
		srv.TLSConfig, srv.ImplicitTLS = serverTLS, true
	case "insecure-auth":
		srv.AllowInsecureAuth = true
	case "remote":
		*remote = &net.TCPAddr{IP: net.ParseIP(f[1]), Port: 40000}
	case "max-recipients":
		srv.MaxRecipients = arg()
	case "max-message":
		srv.MaxMessageBytes = int64(arg())
	case "max-errors":
		srv.MaxErrors = arg()
	case "max-before-auth":
		srv.MaxCommandsBeforeAuth = arg()
	case "max-data-line":
		srv.MaxDataLineLength = arg()
	default:
		t.Fatalf("unknown directive %q", f[0])
	}
}

// readReplies reads n complete (possibly multi-line) replies.
func readReplies(t *testing.T, conn net.Conn, br *bufio.Reader, n int) []string {
	t.Helper()
	_ = conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	var got []string
	for n > 0 {
		l, err := br.ReadString('\n')
		if err != nil {
			t.Fatalf("reading reply: %v (so far %q)", err, got)
		}
		l = strings.TrimSuffix(l, "\r\n")
		got = append(got, l)
		if len(l) < 4 || l[3] == ' ' {
			n--
		}
	}
	return got
}

func newLimiterForTest() *textconn.Limiter { return textconn.NewLimiter(1, 0) }
