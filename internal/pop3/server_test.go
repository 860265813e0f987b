package pop3

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strings"
	"testing"
	"time"

	"quill/internal/textconn/textconntest"
)

func TestServeRejectsBadConfig(t *testing.T) {
	for name, srv := range map[string]*Server{
		"no backend":          {},
		"implicit TLS no cfg": {Backend: newMemBackend(), ImplicitTLS: true},
	} {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		if err := srv.Serve(ln); err == nil || errors.Is(err, ErrServerClosed) {
			t.Errorf("%s: Serve = %v, want a configuration error", name, err)
		}
		if _, err := ln.Accept(); err == nil {
			t.Errorf("%s: listener left open", name)
		}
	}
}

// A panicking backend costs only its own connection.
func TestPanicDoesNotReachClient(t *testing.T) {
	srv := &Server{Hostname: "pop.test", Backend: fixture(), Logger: testLogger(t)}
	addr := startServer(t, srv, netipAddr(""))
	c := dial(t, addr, nil)
	c.readLine()
	c.send("USER panic")
	c.response("USER panic")
	c.send("PASS x")
	if got := c.readLine(); got != "<EOF>" {
		t.Fatalf("after a backend panic the client read %q, want the connection closed", got)
	}
	c2 := dial(t, addr, nil)
	c2.readLine()
	c2.send("USER alice")
	c2.response("")
	c2.send("PASS secret")
	if got := c2.readLine(); !strings.HasPrefix(got, "+OK") {
		t.Fatalf("server after panic: %q", got)
	}
	c2.send("QUIT")
	c2.response("")
}

// Close drops sessions at once; their maildrops are unlocked unchanged.
func TestCloseUnlocksMaildrops(t *testing.T) {
	b := fixture()
	srv := &Server{Hostname: "pop.test", Backend: b, Logger: testLogger(t)}
	addr := startServer(t, srv, netipAddr(""))
	c := dial(t, addr, nil)
	c.readLine()
	for _, cmd := range []string{"USER alice", "PASS secret", "DELE 1"} {
		c.send(cmd)
		if got := c.readLine(); !strings.HasPrefix(got, "+OK") {
			t.Fatalf("%s: %q", cmd, got)
		}
	}
	if err := srv.Close(); err != nil {
		t.Fatal(err)
	}
	// Close races the shutdown notice with closing the socket; either
	// way the connection ends.
	got := c.readLine()
	if got == "-ERR "+errShuttingDown.text {
		got = c.readLine()
	}
	if got != "<EOF>" {
		t.Fatalf("after Close the client read %q", got)
	}
	b.waitUnlocked(t, "alice")
	wantStateT(t, b, "alice", 3, 0, 1)
}

func wantStateT(t *testing.T, b *memBackend, user string, msgs, commits, closes int) {
	t.Helper()
	uids, gotCommits, gotCloses := b.state(user)
	if len(uids) != msgs || gotCommits != commits || gotCloses != closes {
		t.Errorf("%s: %d messages, %d commits, %d closes; want %d, %d, %d",
			user, len(uids), gotCommits, gotCloses, msgs, commits, closes)
	}
}

// RFC 2595 section 4: plaintext pipelined after STLS must not be executed
// inside the TLS session (command injection).
func TestSTLSDiscardsPipelinedPlaintext(t *testing.T) {
	serverTLS, clientTLS := tlsConfigs(t)
	srv := &Server{Hostname: "pop.test", Backend: fixture(), TLSConfig: serverTLS, Logger: testLogger(t)}
	addr := startServer(t, srv, netipAddr("192.0.2.7"))
	c := dial(t, addr, nil)
	c.readLine()
	c.send("STLS\r\nUSER alice")
	if got := c.readLine(); got != "+OK begin TLS negotiation" {
		t.Fatalf("STLS: %q", got)
	}
	c.startTLS(clientTLS)
	c.send("PASS secret")
	if got := c.readLine(); got != "-ERR USER first" {
		t.Fatalf("PASS after injected USER: %q, want -ERR USER first", got)
	}
	c.send("QUIT")
	c.response("")
}

// A failed TLS handshake ends that connection only.
func TestSTLSHandshakeFailure(t *testing.T) {
	serverTLS, _ := tlsConfigs(t)
	srv := &Server{Hostname: "pop.test", Backend: fixture(), TLSConfig: serverTLS, Logger: testLogger(t)}
	addr := startServer(t, srv, netipAddr(""))
	c := dial(t, addr, nil)
	c.readLine()
	c.send("STLS")
	c.readLine()
	tc := tls.Client(c.conn, &tls.Config{ServerName: "localhost"}) // does not trust the test CA
	if err := tc.Handshake(); err == nil {
		t.Fatal("handshake with an untrusted certificate succeeded")
	}
	tc.Close()
	c2 := dial(t, addr, nil)
	if got := c2.readLine(); !strings.HasPrefix(got, "+OK") {
		t.Fatalf("greeting after a failed handshake: %q", got)
	}
}

// Credentials never reach the log.
func TestPasswordsNotLogged(t *testing.T) {
	var logBuf lockedBuffer
	srv := &Server{Hostname: "pop.test", Backend: fixture(),
		Logger: slog.New(slog.NewTextHandler(&logBuf, &slog.HandlerOptions{Level: slog.LevelDebug}))}
	addr := startServer(t, srv, netipAddr(""))
	c := dial(t, addr, nil)
	c.readLine()
	for _, cmd := range []string{"USER alice", "PASS wrong-password-xyzzy", "AUTH PLAIN AGFsaWNlAHBsdWdoAA==", "USER broken", "PASS secret-plugh", "USER alice", "PASS secret", "QUIT"} {
		c.send(cmd)
		c.response(cmd)
	}
	srv.Shutdown(context.Background())
	log := logBuf.String()
	if !strings.Contains(log, "authentication failed") {
		t.Fatalf("log lacks the failures:\n%s", log)
	}
	for _, secret := range []string{"xyzzy", "plugh", "secret", "AGFsaWNl"} {
		if strings.Contains(log, secret) {
			t.Errorf("log contains %q:\n%s", secret, log)
		}
	}
}

// BenchmarkRetr measures RETR over loopback, including byte-stuffing.
func BenchmarkRetr(b *testing.B) {
	for _, size := range []int{5 << 10, 1 << 20} {
		b.Run(fmt.Sprintf("%dKB", size>>10), func(b *testing.B) {
			line := "a line of text that is typical for a mail body, 72 characters long...\r\n"
			body := "Subject: bench\r\n\r\n" + strings.Repeat(line, size/len(line)+1)
			be := newMemBackend()
			be.addUser("u", "p", memMessage{uid: "1", body: body})
			srv := &Server{Hostname: "pop.test", Backend: be, Logger: slog.New(slog.DiscardHandler)}
			addr := startServer(b, srv, netipAddr(""))
			c := dial(b, addr, nil)
			c.readLine()
			c.send("USER u")
			c.readLine()
			c.send("PASS p")
			c.readLine()
			end := []byte("\r\n.\r\n")
			buf := make([]byte, 64<<10)
			b.SetBytes(int64(len(body)))
			b.ResetTimer()
			for range b.N {
				_ = c.conn.SetDeadline(time.Now().Add(20 * time.Second))
				c.send("RETR 1")
				// The response is the status line, the body and the
				// terminator; its tail is the only place "\r\n.\r\n" occurs.
				var tail []byte
				for !bytes.HasSuffix(tail, end) {
					n, err := c.r.Read(buf)
					if err != nil {
						b.Fatal(err)
					}
					tail = append(tail[:0], tail[max(0, len(tail)-4):]...)
					tail = append(tail, buf[:n]...)
				}
			}
			b.StopTimer()
			c.send("QUIT")
			c.readLine()
		})
	}
}

var _ io.Writer = (*lockedBuffer)(nil)

// RFC 2449 section 6.6: responses to pipelined retrievals go out together,
// in one network write once the pipelined commands are all answered, not in
// one or more writes per message.
func TestPipelinedRetrievalsShareWrites(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	cl := &textconntest.WriteCountingListener{Listener: ln}
	// Each larger than the connection's initial 4 KiB buffer, together
	// smaller than what it grows to.
	b := newMemBackend()
	body := "Subject: x\r\n\r\n" + strings.Repeat("0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcde\r\n", 96)
	b.addUser("frank", "pw", memMessage{uid: "f-1", body: body}, memMessage{uid: "f-2", body: body}, memMessage{uid: "f-3", body: body})
	addr := serveListener(t, &Server{Hostname: "pop.test", Backend: b, Logger: testLogger(t)}, cl)
	c := dial(t, addr, nil)
	c.readLine()
	c.send("USER frank")
	c.response("USER")
	c.send("PASS pw")
	c.response("PASS")
	before := cl.Writes()
	c.send("RETR 1\r\nRETR 2\r\nRETR 3")
	for _, n := range []string{"1", "2", "3"} {
		if r := c.response("RETR " + n); !strings.HasPrefix(r[0], "+OK") || r[len(r)-1] != "." {
			t.Fatalf("RETR %s: %q", n, r)
		}
	}
	if got := cl.Writes() - before; got != 1 {
		t.Errorf("three pipelined RETR took %d network writes, want 1", got)
	}
	c.send("QUIT")
	c.response("QUIT")
}
