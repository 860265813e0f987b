package e2e

import (
	"bufio"
	"bytes"
	"encoding/json"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

type imapResult struct {
	CapsBeforeTLS []string `json:"caps_before_tls"`
	Caps          []string `json:"caps"`
	List          []string `json:"list"`
	AppendUID     string   `json:"appenduid"`
	Exists        int      `json:"exists"`
	Fetch         []string `json:"fetch"`
	BodyEqual     bool     `json:"body_equal"`
	Unseen        string   `json:"unseen"`
	SearchSubject string   `json:"search_subject"`
	Copy          string   `json:"copy"`
	Move          string   `json:"move"`
	Expunge       []string `json:"expunge"`
	StatusArchive string   `json:"status_archive"`
	StatusTrash   string   `json:"status_trash"`
	IdleDone      string   `json:"idle_done"`
	IdlePushed    []string `json:"idle_pushed"`
	IdleSubject   string   `json:"idle_subject"`
	// Octets received under COMPRESS=DEFLATE, on the wire and inflated.
	CompressWireIn  int `json:"compress_wire_in"`
	CompressPlainIn int `json:"compress_plain_in"`
}

// TestIMAPPython drives the real binary's IMAP listener with Python's
// imaplib over STARTTLS, and wakes its IDLE with a delivery through the
// real SMTP listener. Everything after LOGIN, IDLE included, runs under
// COMPRESS=DEFLATE (zlib on the client side).
func TestIMAPPython(t *testing.T) {
	s := startServer(t, Options{})
	user := "alice@" + s.Domain
	addUser(t, s, user, "correct horse battery")
	// One message before the client starts, by SMTP.
	if err := smtpSend(s.Addr("smtp"), false, "bob@example.org", []string{user},
		[]byte("From: bob@example.org\r\nSubject: first\r\n\r\nfirst body\r\n")); err != nil {
		t.Fatalf("SMTP: %v", err)
	}

	py := requireTool(t, "python3")
	host, p := "127.0.0.1", port(t, s.Addr("imap"))
	cmd := exec.Command(py, filepath.Join("testdata", "imap_client.py"), host, p, user, "correct horse battery")
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	// The script's IDLE is bounded by this kill, not by a sleep.
	timer := time.AfterFunc(2*time.Minute, func() { cmd.Process.Kill() })
	defer timer.Stop()
	sc := bufio.NewScanner(stdout)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	var last string
	for sc.Scan() {
		line := sc.Text()
		if line == "IDLING" {
			if err := smtpSend(s.Addr("smtp"), false, "carol@example.org", []string{user},
				[]byte("From: carol@example.org\r\nSubject: wake up\r\n\r\nbody\r\n")); err != nil {
				t.Errorf("SMTP during IDLE: %v", err)
			}
			continue
		}
		last = line
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("imap_client.py: %v\nstdout: %s\nstderr: %s\nserver log:\n%s", err, last, stderr.Bytes(), s.Log())
	}
	var r imapResult
	if err := json.Unmarshal([]byte(last), &r); err != nil {
		t.Fatalf("output %q: %v\nstderr: %s", last, err, stderr.Bytes())
	}
	t.Logf("imaplib: %+v", r)

	if !slices.Contains(r.CapsBeforeTLS, "STARTTLS") || !slices.Contains(r.Caps, "IDLE") || slices.Contains(r.Caps, "STARTTLS") {
		t.Errorf("capabilities before TLS %v, after login %v", r.CapsBeforeTLS, r.Caps)
	}
	if !slices.Contains(r.Caps, "COMPRESS=DEFLATE") || r.CompressWireIn == 0 || r.CompressPlainIn <= r.CompressWireIn {
		t.Errorf("COMPRESS=DEFLATE: capabilities %v, %d octets on the wire inflated to %d", r.Caps, r.CompressWireIn, r.CompressPlainIn)
	}
	for _, want := range []string{`\Sent`, `\Trash`, `"INBOX"`} {
		if !strings.Contains(strings.Join(r.List, "\n"), strings.Trim(want, `"`)) {
			t.Errorf("LIST %v lacks %s", r.List, want)
		}
	}
	if r.Exists != 2 || !r.BodyEqual || len(r.Fetch) != 2 {
		t.Errorf("SELECT EXISTS %d, FETCH %v, body equal %v; want 2 messages and the appended body", r.Exists, r.Fetch, r.BodyEqual)
	}
	if r.Unseen != "2" {
		t.Errorf("UNSEEN search %q after STORE +FLAGS \\Seen on 1", r.Unseen)
	}
	if r.SearchSubject != "2" {
		t.Errorf("UID SEARCH SUBJECT = %q, want UID 2", r.SearchSubject)
	}
	if r.Copy != "OK" || r.Move != "OK" {
		t.Errorf("COPY %q, MOVE %q", r.Copy, r.Move)
	}
	if !strings.Contains(r.StatusArchive, "MESSAGES 0") || !strings.Contains(r.StatusTrash, "MESSAGES 1") {
		t.Errorf("after expunge: %q, %q", r.StatusArchive, r.StatusTrash)
	}
	if !strings.Contains(r.IdleDone, "OK") || r.IdleSubject != "Subject: wake up" {
		t.Errorf("IDLE ended %q, pushed %v, newest subject %q", r.IdleDone, r.IdlePushed, r.IdleSubject)
	}
}
