package e2e

import (
	"os/exec"
	"strings"
	"testing"
)

// TestIMAPEnabledLater is a POP3-only operator turning IMAP on: mail
// delivered while no IMAP listener was enabled was stored without its
// summary (docs/adr/0011), and Python's imaplib, after a restart with
// IMAP, gets the same ENVELOPE and BODYSTRUCTURE from the first FETCH
// (which computes and keeps the summary) as from the second (which reads
// it); the store is consistent afterwards.
func TestIMAPEnabledLater(t *testing.T) {
	pop3Only := startServer(t, Options{Listen: map[string]string{"imap": "off", "imaps": "off"}})
	user := "alice@" + pop3Only.Domain
	addUser(t, pop3Only, user, "correct horse battery")
	msg := "From: Bob <bob@example.org>\r\nTo: alice@example.test\r\nSubject: before IMAP\r\n" +
		"Content-Type: multipart/mixed; boundary=b\r\n\r\n--b\r\nContent-Type: text/plain\r\n\r\nhello\r\n" +
		"--b\r\nContent-Type: application/octet-stream\r\nContent-Transfer-Encoding: base64\r\n\r\nAAEC\r\n--b--\r\n"
	if err := smtpSend(pop3Only.Addr("smtp"), false, "bob@example.org", []string{user}, []byte(msg)); err != nil {
		t.Fatalf("SMTP: %v", err)
	}
	pop3Only.Stop(t)

	s := startServer(t, Options{DataDir: pop3Only.DataDir})
	py := requireTool(t, "python3")
	const script = `
import imaplib, sys
c = imaplib.IMAP4(sys.argv[1], int(sys.argv[2]))
c.login(sys.argv[3], sys.argv[4])
c.select("INBOX")
for _ in range(2):
    typ, data = c.fetch("1", "(ENVELOPE BODYSTRUCTURE)")
    assert typ == "OK", data
    print(b"".join(p if isinstance(p, bytes) else b"".join(p) for p in data).decode())
c.logout()
`
	out, err := exec.Command(py, "-c", script, "127.0.0.1", port(t, s.Addr("imap")), user, "correct horse battery").CombinedOutput()
	if err != nil {
		t.Fatalf("imaplib: %v\n%s", err, out)
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	if len(lines) != 2 || lines[0] != lines[1] {
		t.Fatalf("the two FETCHes differ:\n%s", out)
	}
	for _, want := range []string{`"before IMAP"`, `(("text" "plain"`, `"application" "octet-stream"`, `"mixed"`} {
		if !strings.Contains(lines[0], want) {
			t.Errorf("FETCH lacks %s: %s", want, lines[0])
		}
	}
	s.Stop(t)
	if out := mustQuill(t, "", "check", "--data", s.DataDir); !strings.Contains(out, "consistent") {
		t.Errorf("quill check: %s", out)
	}
}
