package server

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"quill/internal/auth"
	"quill/internal/config"
	"quill/internal/store/embedded"
)

// addUsers creates the given users with a cheap KDF.
func addUsers(t *testing.T, cfg config.Config, addrs ...string) {
	t.Helper()
	st, err := embedded.Open(filepath.Join(cfg.DataDir, StoreDir), embedded.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	d := &auth.Directory{Store: st, KDF: auth.KDFParams{MemoryKiB: 64, Time: 1, Threads: 1}}
	for _, a := range addrs {
		if err := d.AddUser(context.Background(), a, "password1", 0); err != nil {
			t.Fatal(err)
		}
	}
}

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
	addUsers(t, cfg, users...)
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
