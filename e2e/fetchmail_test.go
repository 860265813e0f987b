package e2e

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"
)

// fetchmail exit statuses (fetchmail(1) "EXIT CODES").
const (
	fetchmailGotMail = 0
	fetchmailNoMail  = 1
)

// TestFetchmail retrieves a maildrop with fetchmail over POP3 upgraded with
// STLS (sslproto auto requires TLS), hands each message to an MDA that
// writes it to a file, and checks the bytes and that --nokeep emptied the
// maildrop.
func TestFetchmail(t *testing.T) {
	fetchmail := requireTool(t, "fetchmail")
	s := startServer(t, Options{})
	const carol, carolPW = "carol@example.test", "fetchmail carol pw"
	addUser(t, s, carol, carolPW)

	sent := map[string][]byte{}
	for i := 0; i < 3; i++ {
		tok := token()
		msg := testMessage("sender@remote.example", carol, fmt.Sprintf("fetchmail %d", i), tok)
		if err := smtpSend(s.Addr("smtp"), false, "sender@remote.example", []string{carol}, msg); err != nil {
			t.Fatalf("deliver message %d: %v", i, err)
		}
		sent[tok] = msg
	}

	home := t.TempDir()
	out := filepath.Join(home, "delivered")
	if err := os.Mkdir(out, 0o700); err != nil {
		t.Fatal(err)
	}
	// The MDA runs once per message; each gets its own file.
	mda := filepath.Join(home, "mda.sh")
	script := "#!/bin/sh\nset -e\nf=$(mktemp \"" + out + "/msg.XXXXXX\")\ncat > \"$f\"\n"
	if err := os.WriteFile(mda, []byte(script), 0o700); err != nil {
		t.Fatal(err)
	}
	// fetchmail refuses an rc file others can read; the password lives
	// only there. sslcertck is off: the certificate is self-signed.
	rc := filepath.Join(home, "fetchmailrc")
	rcText := fmt.Sprintf(`set no syslog
set no bouncemail
poll 127.0.0.1 service %s protocol POP3 auth password timeout 30
  user %q password %q
  sslproto "auto" no sslcertck
  mda %q
`, port(t, s.Addr("pop3")), carol, carolPW, mda)
	if err := os.WriteFile(rc, []byte(rcText), 0o600); err != nil {
		t.Fatal(err)
	}

	run := func() (string, int) {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), cliTimeout)
		defer cancel()
		cmd := exec.CommandContext(ctx, fetchmail, "--fetchmailrc", rc, "--nodetach", "--nokeep", "--fetchall", "--verbose")
		cmd.Env = append(os.Environ(), "HOME="+home, "FETCHMAILHOME="+home)
		var b bytes.Buffer
		cmd.Stdout, cmd.Stderr = &b, &b
		err := cmd.Run()
		var ee *exec.ExitError
		switch {
		case err == nil:
			return b.String(), 0
		case ctx.Err() != nil:
			t.Fatalf("fetchmail timed out:\n%s", b.String())
		case errors.As(err, &ee):
			return b.String(), ee.ExitCode()
		default:
			t.Fatalf("fetchmail: %v", err)
		}
		return "", -1
	}

	log, code := run()
	if code != fetchmailGotMail {
		t.Fatalf("fetchmail exit %d, want %d:\n%s", code, fetchmailGotMail, log)
	}
	// The verbose log shows the dialogue: STLS, and PASS only after it.
	stls, pass := strings.Index(log, "POP3> STLS"), strings.Index(log, "POP3> PASS")
	if stls < 0 || (pass >= 0 && pass < stls) {
		t.Errorf("fetchmail did not upgrade with STLS before PASS:\n%s", log)
	}

	files, err := filepath.Glob(filepath.Join(out, "msg.*"))
	if err != nil {
		t.Fatal(err)
	}
	sort.Strings(files)
	if len(files) != len(sent) {
		t.Fatalf("the MDA got %d messages, want %d:\n%s", len(files), len(sent), log)
	}
	for _, f := range files {
		got, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		// fetchmail hands the MDA LF line ends and may prepend its own
		// Received field; compare on CRLF-normalised bytes.
		got = bytes.ReplaceAll(bytes.ReplaceAll(got, []byte("\r\n"), []byte("\n")), []byte("\n"), []byte("\r\n"))
		var want []byte
		for tok, m := range sent {
			if bytes.Contains(got, []byte("token "+tok+"\r\n")) {
				want = m
				delete(sent, tok)
			}
		}
		if want == nil {
			t.Errorf("%s is none of the messages sent (or a duplicate):\n%s", f, got)
			continue
		}
		if err := checkDelivered(got, want); err != nil {
			t.Errorf("%s: %v", f, err)
		}
	}

	// --nokeep: the maildrop is empty now, and a second run finds nothing.
	if msgs := mustFetchAll(t, s.Addr("pop3"), carol, carolPW); len(msgs) != 0 {
		t.Errorf("maildrop holds %d messages after fetchmail --nokeep, want 0", len(msgs))
	}
	if log, code := run(); code != fetchmailNoMail {
		t.Errorf("second fetchmail exit %d, want %d (no mail):\n%s", code, fetchmailNoMail, log)
	}
}
