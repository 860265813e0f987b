package e2e

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestDiskFull fills the file system under a running server (a small
// tmpfs), and checks that it refuses mail with 4xx and says so on /readyz
// and in quill_store_writable while POP3 deletions still work; that it
// accepts mail again, without a restart, once a filler file is deleted;
// and that after a restart every acknowledged message is there,
// byte-exact (docs/adr/0013-full-disk.md).
func TestDiskFull(t *testing.T) {
	mnt := mountTmpfs(t, 128<<20)
	data := filepath.Join(mnt, "data")
	if err := os.Mkdir(data, 0o700); err != nil {
		t.Fatal(err)
	}
	cfg := filepath.Join(t.TempDir(), "quill.toml")
	const reserve = 16 << 20
	if err := os.WriteFile(cfg, []byte(fmt.Sprintf("[store]\nreserve_bytes = %d\n", reserve)), 0o600); err != nil {
		t.Fatal(err)
	}
	s := startServer(t, Options{DataDir: data, ConfigFile: cfg})
	const user, pw = "full@example.test", "disk full pw"
	addUser(t, s, user, pw)
	admin := "http://" + s.Addr("admin")
	if code, body := httpGet(t, admin+"/readyz"); code != 200 {
		t.Fatalf("/readyz before filling: %d %s", code, body)
	}

	// Leave 6 MiB free beside the store and its reserve.
	filler := filepath.Join(mnt, "filler")
	var st syscall.Statfs_t
	if err := syscall.Statfs(mnt, &st); err != nil {
		t.Fatal(err)
	}
	fillTo(t, filler, int64(st.Bavail)*st.Bsize-6<<20)

	acked := map[string][]byte{} // token -> message acknowledged with 250
	send := func() (string, error) {
		tok := token()
		msg := bigMessage(user, tok, 96<<10)
		err := smtpSend(s.Addr("smtp"), false, "sender@remote.test", []string{user}, msg)
		if err == nil {
			acked[tok] = msg
		}
		return tok, err
	}
	// 6 MiB hold about 64 messages of 96 KiB; the reserve's release lets
	// the group that met ENOSPC finish, so mail is refused from then on.
	var refused *SMTPError
	for i := 0; refused == nil; i++ {
		if i == 400 {
			t.Fatalf("no delivery refused after %d messages on a full disk", i)
		}
		_, err := send()
		if err != nil && !errors.As(err, &refused) {
			t.Fatalf("delivery %d: %v", i, err)
		}
	}
	if refused.Code < 400 || refused.Code > 499 {
		t.Fatalf("delivery on a full disk answered %d %s, want a 4xx", refused.Code, refused.Text)
	}
	t.Logf("%d messages acknowledged, then %s: %d %s", len(acked), refused.Cmd, refused.Code, refused.Text)
	for range 3 {
		var se *SMTPError
		if _, err := send(); !errors.As(err, &se) || se.Code/100 != 4 {
			t.Fatalf("delivery while the disk is full: %v, want a 4xx", err)
		}
	}
	if code, body := httpGet(t, admin+"/readyz"); code != http.StatusServiceUnavailable || !strings.Contains(body, "disk full") {
		t.Errorf("/readyz on a full disk: %d %q, want 503 saying disk full", code, body)
	}
	if code, body := httpGet(t, admin+"/healthz"); code != 200 || !strings.Contains(body, "disk full") {
		t.Errorf("/healthz on a full disk: %d %q, want 200 saying disk full", code, body)
	}
	if m := metric(t, admin, "quill_store_writable"); m != "0" {
		t.Errorf("quill_store_writable on a full disk = %q, want 0", m)
	}

	// IMAP: an APPEND is refused as temporary (RFC 5530 UNAVAILABLE).
	if tagged := imapAppend(t, s.Addr("imap"), user, pw, bigMessage(user, token(), 1<<10)); !strings.HasPrefix(tagged, "c NO [UNAVAILABLE]") {
		t.Errorf("IMAP APPEND on a full disk: %q, want NO [UNAVAILABLE]", tagged)
	}

	// A deletion still succeeds, in the reserve's room.
	p, err := dialPOP3(s.Addr("pop3"), user, pw)
	if err != nil {
		t.Fatalf("POP3 login on a full disk: %v", err)
	}
	first, err := p.Retr(1)
	if err != nil {
		t.Fatalf("RETR 1: %v", err)
	}
	if _, err := p.cmd("DELE 1"); err != nil {
		t.Fatalf("DELE 1: %v", err)
	}
	if err := p.Quit(); err != nil {
		t.Fatalf("QUIT (the expunge) on a full disk: %v", err)
	}
	deleted := ""
	for tok, msg := range acked {
		if strings.Contains(string(first), tok) {
			deleted = tok
			if err := checkDelivered(first, msg); err != nil {
				t.Fatal(err)
			}
		}
	}
	if deleted == "" {
		t.Fatalf("message 1 is none of the acknowledged ones:\n%.300s", first)
	}
	delete(acked, deleted)

	// Space comes back: the node recovers by itself.
	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, "/readyz answering 200 after space is freed", func() error {
		if code, body := httpGet(t, admin+"/readyz"); code != 200 {
			return fmt.Errorf("%d %s", code, body)
		}
		return nil
	})
	if m := metric(t, admin, "quill_store_writable"); m != "1" {
		t.Errorf("quill_store_writable after recovery = %q, want 1", m)
	}
	for i := range 10 {
		if _, err := send(); err != nil {
			t.Fatalf("delivery %d after space was freed: %v", i, err)
		}
	}
	// Records below Warn reach the log within log.flush_interval.
	eventually(t, 30*time.Second, "the log marking entering and leaving the full state", func() error {
		for _, line := range []string{"store disk full", "store disk space available again"} {
			if !strings.Contains(s.Log(), line) {
				return fmt.Errorf("no %q in the log", line)
			}
		}
		return nil
	})

	s.Restart(t)
	got := mustFetchAll(t, s.Addr("pop3"), user, pw)
	if len(got) != len(acked) {
		t.Errorf("after restart: %d messages, want the %d acknowledged and not deleted", len(got), len(acked))
	}
	for tok, msg := range acked {
		m := findToken(got, tok)
		if len(m) != 1 {
			t.Errorf("acknowledged message %s stored %d times", tok, len(m))
			continue
		}
		if err := checkDelivered(m[0], msg); err != nil {
			t.Errorf("message %s: %v", tok, err)
		}
	}
	if len(findToken(got, deleted)) != 0 {
		t.Errorf("message %s deleted on the full disk came back", deleted)
	}
}

// mountTmpfs mounts a tmpfs of size bytes on a new directory, unmounted at
// cleanup (after the server using it has stopped: cleanups run last first).
func mountTmpfs(t *testing.T, size int64) string {
	t.Helper()
	dir := t.TempDir()
	out, err := exec.Command("mount", "-t", "tmpfs", "-o", fmt.Sprintf("size=%d,mode=0700", size), "tmpfs", dir).CombinedOutput()
	if err != nil {
		t.Skipf("mounting a tmpfs is not permitted here (needs root): %v: %s", err, out)
	}
	t.Cleanup(func() {
		if out, err := exec.Command("umount", dir).CombinedOutput(); err != nil {
			t.Errorf("umount %s: %v: %s", dir, err, out)
		}
	})
	return dir
}

// fillTo writes a file of n zero bytes (written, so that they occupy the
// tmpfs).
func fillTo(t *testing.T, name string, n int64) {
	t.Helper()
	f, err := os.Create(name)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	buf := make([]byte, 1<<20)
	for n > 0 {
		w := min(n, int64(len(buf)))
		if _, err := f.Write(buf[:w]); err != nil {
			t.Fatalf("writing the filler: %v", err)
		}
		n -= w
	}
}

// bigMessage is testMessage with about size bytes of text lines added.
func bigMessage(to, tok string, size int) []byte {
	msg := testMessage("sender@remote.test", to, "disk full "+tok, tok)
	line := strings.Repeat(tok, 8) + "\r\n" // 130 bytes
	return append(msg, strings.Repeat(line, size/len(line))...)
}

func httpGet(t *testing.T, url string) (int, string) {
	t.Helper()
	c := http.Client{Timeout: 10 * time.Second}
	resp, err := c.Get(url)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 4<<20))
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	return resp.StatusCode, string(b)
}

// metric returns the value of an unlabelled metric from /metrics.
func metric(t *testing.T, admin, name string) string {
	t.Helper()
	_, body := httpGet(t, admin+"/metrics")
	for _, l := range strings.Split(body, "\n") {
		if v, ok := strings.CutPrefix(l, name+" "); ok {
			return strings.TrimSpace(v)
		}
	}
	t.Fatalf("/metrics has no %s", name)
	return ""
}

// imapAppend logs in over plain IMAP (allowed from loopback), appends msg
// to INBOX and returns the APPEND's tagged reply.
func imapAppend(t *testing.T, addr, user, pass string, msg []byte) string {
	t.Helper()
	c, err := dialText(addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	tagged := func(tag string) string {
		for {
			line, err := c.readLine()
			if err != nil {
				t.Fatalf("IMAP: %v", err)
			}
			if strings.HasPrefix(line, tag+" ") || strings.HasPrefix(line, "+") {
				return line
			}
		}
	}
	if _, err := c.readLine(); err != nil { // greeting
		t.Fatal(err)
	}
	if err := c.writeLine(fmt.Sprintf("a LOGIN %q %q", user, pass)); err != nil {
		t.Fatal(err)
	}
	if r := tagged("a"); !strings.HasPrefix(r, "a OK") {
		t.Fatalf("IMAP LOGIN: %q", r)
	}
	if err := c.writeLine(fmt.Sprintf("c APPEND INBOX {%d}", len(msg))); err != nil {
		t.Fatal(err)
	}
	r := tagged("c")
	if !strings.HasPrefix(r, "+") {
		return r
	}
	if _, err := c.conn.Write(append(msg, "\r\n"...)); err != nil {
		t.Fatal(err)
	}
	return tagged("c")
}
