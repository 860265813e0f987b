package server

import (
	"bufio"
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"quill/internal/auth"
	"quill/internal/config"
	"quill/internal/store/embedded"
)

func testConfig(t *testing.T) config.Config {
	t.Helper()
	dir := t.TempDir()
	cfg := config.Default()
	cfg.Hostname = "mx.example.test"
	cfg.Domains = []string{"example.test"}
	cfg.DataDir = filepath.Join(dir, "data")
	l := &cfg.Listeners
	l.SMTP, l.Submission, l.Submissions, l.LMTP = "127.0.0.1:0", "off", "off", "off"
	l.POP3, l.POP3S, l.Admin = "127.0.0.1:0", "off", "127.0.0.1:0"
	l.IMAP, l.IMAPS = "off", "off"
	// Unix socket paths are limited to ~107 bytes; t.TempDir can be long.
	sock, err := os.MkdirTemp("", "qs")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(sock) })
	l.LMTPSocket = filepath.Join(sock, "lmtp.sock")
	return cfg
}

// addUser creates the given users, password "password1", with a cheap KDF.
func addUser(t *testing.T, cfg config.Config, addrs ...string) {
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

// converse reads the greeting, then sends each line and reads one reply
// (possibly multi-line) for it. A message body with its final "." is one
// line here, answered by one reply per accepted LMTP recipient; tests use
// one accepted recipient.
func converse(t *testing.T, c net.Conn, lines ...string) []string {
	t.Helper()
	c.SetDeadline(time.Now().Add(30 * time.Second))
	r := bufio.NewReader(c)
	var out []string
	readReply := func() {
		for {
			line, err := r.ReadString('\n')
			if err != nil {
				t.Fatalf("reading reply: %v (so far %q)", err, out)
			}
			out = append(out, strings.TrimRight(line, "\r\n"))
			if len(line) < 4 || line[3] != '-' {
				return
			}
		}
	}
	readReply()
	for _, l := range lines {
		if _, err := io.WriteString(c, l+"\r\n"); err != nil {
			t.Fatal(err)
		}
		readReply()
	}
	return out
}

func TestServeLMTPSocketAndShutdown(t *testing.T) {
	cfg := testConfig(t)
	addUser(t, cfg, "alice@example.test")
	s, err := New(cfg, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Start(); err != nil {
		t.Fatal(err)
	}
	stopped := false
	t.Cleanup(func() {
		if !stopped {
			s.Shutdown(context.Background())
		}
	})
	ls := s.Listeners()
	for _, name := range []string{"smtp", "pop3", "admin", "lmtp_socket"} {
		if ls[name] == "" {
			t.Fatalf("listener %s missing from %v", name, ls)
		}
	}
	if _, ok := ls["submission"]; ok {
		t.Fatal("a listener set to off is bound")
	}
	if b, err := os.ReadFile(filepath.Join(cfg.DataDir, AdminAddrFile)); err != nil || strings.TrimSpace(string(b)) != ls["admin"] {
		t.Fatalf("admin.addr = %q, %v", b, err)
	}

	c, err := net.Dial("unix", cfg.Listeners.LMTPSocket)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	replies := converse(t, c, "LHLO client.example.test", "MAIL FROM:<sender@remote.test>",
		"RCPT TO:<alice@example.test>", "RCPT TO:<nobody@example.test>", "DATA",
		"Subject: over the socket\r\n\r\nhello\r\n.")
	last := replies[len(replies)-1]
	if !strings.HasPrefix(last, "250 ") || !strings.Contains(last, "alice@example.test") {
		t.Fatalf("LMTP replies: %q", replies)
	}
	if !containsPrefix(replies, "550 5.1.1") {
		t.Fatalf("unknown recipient not refused at RCPT: %q", replies)
	}

	get := func(path string) (int, string) {
		resp, err := http.Get("http://" + ls["admin"] + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if code, _ := get("/readyz"); code != 200 {
		t.Fatalf("readyz = %d", code)
	}
	_, metrics := get("/metrics")
	for _, m := range []string{`quill_deliveries_total{result="ok"} 1`, "quill_store_commit_seconds_count",
		`quill_connections_total{listener="lmtp_socket"} 1`, "go_goroutines"} {
		if !strings.Contains(metrics, m) {
			t.Errorf("metrics lack %s", m)
		}
	}

	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := s.Shutdown(ctx); err != nil {
		t.Fatalf("Shutdown: %v", err)
	}
	stopped = true
	if _, err := os.Stat(filepath.Join(cfg.DataDir, AdminAddrFile)); !os.IsNotExist(err) {
		t.Fatalf("admin.addr left after shutdown: %v", err)
	}
	if _, err := net.Dial("tcp", ls["smtp"]); err == nil {
		t.Fatal("SMTP still accepting after shutdown")
	}
	// The store is closed and consistent, with the message in it.
	st, err := embedded.Open(filepath.Join(cfg.DataDir, StoreDir), embedded.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	inbox, err := st.GetMailbox(context.Background(), "alice@example.test", "INBOX")
	if err != nil || inbox.Messages != 1 {
		t.Fatalf("INBOX after LMTP delivery: %+v, %v", inbox, err)
	}
	if problems, err := st.Check(context.Background()); err != nil || len(problems) > 0 {
		t.Fatalf("Check: %v %v", problems, err)
	}
}

func TestStartFailsCleanlyOnBusyPort(t *testing.T) {
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	cfg := testConfig(t)
	cfg.Listeners.POP3 = busy.Addr().String()
	s, err := New(cfg, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Start(); err == nil || !strings.Contains(err.Error(), "pop3") {
		t.Fatalf("Start on a busy port: %v", err)
	}
	// Everything Start opened is closed again: the store can be reopened.
	st, err := embedded.Open(filepath.Join(cfg.DataDir, StoreDir), embedded.Options{})
	if err != nil {
		t.Fatalf("store still locked after a failed Start: %v", err)
	}
	st.Close()
}

func TestNewRejectsInvalidConfig(t *testing.T) {
	cfg := testConfig(t)
	cfg.Domains = nil
	if _, err := New(cfg, slog.New(slog.DiscardHandler)); err == nil {
		t.Fatal("invalid config accepted")
	}
}

func containsPrefix(lines []string, p string) bool {
	for _, l := range lines {
		if strings.HasPrefix(l, p) {
			return true
		}
	}
	return false
}

// Delivery computes a message's summary when the server serves IMAP, and
// leaves it to IMAP's first use when it does not (docs/adr/0011).
func TestSummariesFollowIMAP(t *testing.T) {
	for _, imapAddr := range []string{"off", "127.0.0.1:0"} {
		t.Run(imapAddr, func(t *testing.T) {
			cfg := testConfig(t)
			cfg.Listeners.IMAP = imapAddr
			addUser(t, cfg, "alice@example.test")
			s, err := New(cfg, slog.New(slog.DiscardHandler))
			if err != nil {
				t.Fatal(err)
			}
			if err := s.Start(); err != nil {
				t.Fatal(err)
			}
			c, err := net.Dial("unix", cfg.Listeners.LMTPSocket)
			if err != nil {
				s.Shutdown(context.Background())
				t.Fatal(err)
			}
			replies := converse(t, c, "LHLO client.example.test", "MAIL FROM:<sender@remote.test>",
				"RCPT TO:<alice@example.test>", "DATA", "Subject: summary\r\n\r\nhello\r\n.")
			c.Close()
			if err := s.Shutdown(context.Background()); err != nil {
				t.Fatal(err)
			}
			if last := replies[len(replies)-1]; !strings.HasPrefix(last, "250 ") {
				t.Fatalf("LMTP replies: %q", replies)
			}
			st, err := embedded.Open(filepath.Join(cfg.DataDir, StoreDir), embedded.Options{})
			if err != nil {
				t.Fatal(err)
			}
			defer st.Close()
			inbox, err := st.GetMailbox(context.Background(), "alice@example.test", "INBOX")
			if err != nil {
				t.Fatal(err)
			}
			msgs, err := st.ListMessages(context.Background(), inbox.ID, 1, 10)
			if err != nil || len(msgs) != 1 {
				t.Fatalf("INBOX: %d messages, %v", len(msgs), err)
			}
			if got, want := len(msgs[0].Meta) > 0, config.Enabled(imapAddr); got != want {
				t.Errorf("IMAP %s: message stored with a summary %v, want %v", imapAddr, got, want)
			}
		})
	}
}
