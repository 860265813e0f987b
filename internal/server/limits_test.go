package server

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strings"
	"testing"
	"time"

	"quill/internal/config"
)

// startServer starts cfg's server and stops it when the test ends.
func startServer(t *testing.T, cfg config.Config) *Server {
	t.Helper()
	s, err := New(cfg, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		s.Shutdown(ctx)
	})
	return s
}

// inboxCount returns the number of messages in user's INBOX, read through
// the running server's store.
func inboxCount(t *testing.T, s *Server, user string) int {
	t.Helper()
	mb, err := s.store.GetMailbox(context.Background(), user, "INBOX")
	if err != nil {
		t.Fatal(err)
	}
	return int(mb.Messages)
}

// smtpClient is a minimal pipelining-free SMTP client over real TCP.
type smtpClient struct {
	t  *testing.T
	c  net.Conn
	br *bufio.Reader
}

func dialSMTP(t *testing.T, addr string) *smtpClient {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	c.SetDeadline(time.Now().Add(60 * time.Second))
	sc := &smtpClient{t: t, c: c, br: bufio.NewReader(c)}
	sc.reply()
	return sc
}

// reply reads one (possibly multi-line) reply and returns its last line,
// or the read error's text.
func (sc *smtpClient) reply() string {
	for {
		line, err := sc.br.ReadString('\n')
		if err != nil {
			return "read error: " + err.Error()
		}
		if len(line) < 4 || line[3] != '-' {
			return strings.TrimRight(line, "\r\n")
		}
	}
}

func (sc *smtpClient) cmd(line string) string {
	if _, err := io.WriteString(sc.c, line+"\r\n"); err != nil {
		return "write error: " + err.Error()
	}
	return sc.reply()
}

// A transaction to more recipients than max_recipients gets 452 4.5.3 for
// the excess (RFC 5321 section 4.5.3.1.10), is not closed with 421 for
// "too many errors", and the message reaches the accepted recipients.
func TestTooManyRecipientsIsNotAnError(t *testing.T) {
	cfg := testConfig(t)
	const n = 150
	var users []string
	for i := range n {
		users = append(users, fmt.Sprintf("u%03d@example.test", i))
	}
	addUser(t, cfg, users...)
	s := startServer(t, cfg)
	sc := dialSMTP(t, s.Listeners()["smtp"])
	sc.cmd("EHLO client.example.test")
	if r := sc.cmd("MAIL FROM:<sender@remote.test>"); !strings.HasPrefix(r, "250") {
		t.Fatalf("MAIL: %s", r)
	}
	accepted, deferred := 0, 0
	for _, u := range users {
		r := sc.cmd("RCPT TO:<" + u + ">")
		switch {
		case strings.HasPrefix(r, "250"):
			accepted++
		case strings.HasPrefix(r, "452 4.5.3"):
			deferred++
		default:
			t.Fatalf("RCPT %s after %d accepted, %d deferred: %s", u, accepted, deferred, r)
		}
	}
	if accepted != cfg.Limits.MaxRecipients || deferred != n-accepted {
		t.Fatalf("%d accepted, %d deferred; want %d and %d", accepted, deferred, cfg.Limits.MaxRecipients, n-cfg.Limits.MaxRecipients)
	}
	if r := sc.cmd("DATA"); !strings.HasPrefix(r, "354") {
		t.Fatalf("DATA: %s", r)
	}
	if r := sc.cmd("Subject: many\r\n\r\nhello\r\n."); !strings.HasPrefix(r, "250") {
		t.Fatalf("end of data: %s", r)
	}
	for i, u := range users {
		want := 0
		if i < accepted {
			want = 1
		}
		if got := inboxCount(t, s, u); got != want {
			t.Fatalf("%s has %d messages, want %d", u, got, want)
		}
	}
	if r := sc.cmd("QUIT"); !strings.HasPrefix(r, "221") {
		t.Fatalf("QUIT: %s", r)
	}
}

// readUntilClosed reads c until the server closes it, within limit, and
// returns what it read.
func readUntilClosed(t *testing.T, c net.Conn, limit time.Duration) string {
	t.Helper()
	c.SetReadDeadline(time.Now().Add(limit))
	b, err := io.ReadAll(c)
	if err != nil {
		t.Fatalf("connection not closed by the server within %v: %v (read %q)", limit, err, b)
	}
	return string(b)
}

// A DATA body that stops arriving is cut off once the client falls below
// min_transfer_rate after transfer_grace, with 421 4.4.2, long before the
// per-read data timeout; nothing is delivered.
func TestSlowDATASenderIsCutOff(t *testing.T) {
	cfg := testConfig(t)
	cfg.Limits.MinTransferRate = 1 << 20
	cfg.Limits.TransferGrace = config.Duration{Duration: 300 * time.Millisecond}
	addUser(t, cfg, "alice@example.test")
	s := startServer(t, cfg)
	sc := dialSMTP(t, s.Listeners()["smtp"])
	sc.cmd("EHLO client.example.test")
	sc.cmd("MAIL FROM:<sender@remote.test>")
	if r := sc.cmd("RCPT TO:<alice@example.test>"); !strings.HasPrefix(r, "250") {
		t.Fatalf("RCPT: %s", r)
	}
	if r := sc.cmd("DATA"); !strings.HasPrefix(r, "354") {
		t.Fatalf("DATA: %s", r)
	}
	io.WriteString(sc.c, "Subject: slow\r\n\r\nthe rest never comes")
	rest := readUntilClosed(t, sc.c, 20*time.Second)
	if !strings.HasPrefix(rest, "421 4.4.2") {
		t.Fatalf("after a stalled body: %q, want 421 4.4.2", rest)
	}
	if n := inboxCount(t, s, "alice@example.test"); n != 0 {
		t.Fatalf("%d messages delivered from a cut-off body", n)
	}
}

// The same for BDAT: the transfer spans the chunks.
func TestSlowBDATSenderIsCutOff(t *testing.T) {
	cfg := testConfig(t)
	cfg.Limits.MinTransferRate = 1 << 20
	cfg.Limits.TransferGrace = config.Duration{Duration: 300 * time.Millisecond}
	addUser(t, cfg, "alice@example.test")
	s := startServer(t, cfg)
	sc := dialSMTP(t, s.Listeners()["smtp"])
	sc.cmd("EHLO client.example.test")
	sc.cmd("MAIL FROM:<sender@remote.test>")
	sc.cmd("RCPT TO:<alice@example.test>")
	io.WriteString(sc.c, "BDAT 1000 LAST\r\nSubject: slow\r\n\r\n")
	rest := readUntilClosed(t, sc.c, 20*time.Second)
	if !strings.HasPrefix(rest, "421 4.4.2") {
		t.Fatalf("after a stalled chunk: %q, want 421 4.4.2", rest)
	}
	if n := inboxCount(t, s, "alice@example.test"); n != 0 {
		t.Fatalf("%d messages delivered from a cut-off body", n)
	}
}

// An APPEND literal that stops arriving ends the session with BYE, and
// nothing is appended.
func TestSlowAPPENDIsCutOff(t *testing.T) {
	cfg := testConfig(t)
	cfg.Listeners.IMAP = "127.0.0.1:0"
	cfg.Limits.MinTransferRate = 1 << 20
	cfg.Limits.TransferGrace = config.Duration{Duration: 300 * time.Millisecond}
	addUser(t, cfg, "alice@example.test")
	s := startServer(t, cfg)
	c, err := net.Dial("tcp", s.Listeners()["imap"])
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(30 * time.Second))
	br := bufio.NewReader(c)
	expect := func(prefix string) {
		t.Helper()
		for {
			line, err := br.ReadString('\n')
			if err != nil {
				t.Fatalf("waiting for %q: %v", prefix, err)
			}
			if strings.HasPrefix(line, prefix) {
				return
			}
		}
	}
	expect("* OK")
	io.WriteString(c, "a LOGIN alice@example.test password1\r\n")
	expect("a OK")
	io.WriteString(c, "b APPEND INBOX {1000}\r\n")
	expect("+ ")
	io.WriteString(c, "Subject: slow\r\n\r\n")
	rest := readUntilClosed(t, c, 20*time.Second)
	if !strings.HasPrefix(rest, "* BYE transfer too slow") {
		t.Fatalf("after a stalled literal: %q", rest)
	}
	if n := inboxCount(t, s, "alice@example.test"); n != 0 {
		t.Fatalf("%d messages appended from a cut-off literal", n)
	}
}

// A stalled TLS handshake on the implicit-TLS submission port is closed
// after tls_handshake_timeout.
func TestStalledTLSHandshakeIsClosed(t *testing.T) {
	cfg := testConfig(t)
	cfg.Listeners.Submissions = "127.0.0.1:0"
	cfg.Limits.TLSHandshakeTimeout = config.Duration{Duration: 300 * time.Millisecond}
	s := startServer(t, cfg)
	// Timed from before the dial: the server may accept, and start its
	// timer, before Dial returns here.
	start := time.Now()
	c, err := net.Dial("tcp", s.Listeners()["submissions"])
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	readUntilClosed(t, c, 20*time.Second)
	if d := time.Since(start); d < 300*time.Millisecond {
		t.Fatalf("closed after %v, before the handshake timeout", d)
	}
}

// Before login (POP3) or EHLO (SMTP) preauth_timeout applies, not the
// longer idle and command timeouts of an established session.
func TestPreauthTimeout(t *testing.T) {
	cfg := testConfig(t)
	cfg.Limits.PreauthTimeout = config.Duration{Duration: 300 * time.Millisecond}
	s := startServer(t, cfg)
	for _, x := range []struct{ listener, want string }{
		{"pop3", "-ERR [SYS/TEMP] autologout"},
		{"smtp", "421 4.4.2"},
	} {
		c, err := net.Dial("tcp", s.Listeners()[x.listener])
		if err != nil {
			t.Fatal(err)
		}
		out := readUntilClosed(t, c, 20*time.Second)
		c.Close()
		lines := strings.Split(strings.TrimSpace(out), "\r\n")
		if len(lines) != 2 || !strings.HasPrefix(lines[1], x.want) {
			t.Errorf("%s before login: %q, want greeting then %q", x.listener, out, x.want)
		}
	}
}
