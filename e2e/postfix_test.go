package e2e

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// postfixDeadline bounds how long a message may take from sendmail to the
// Quill maildrop through a private Postfix instance.
const postfixDeadline = 60 * time.Second

// sbin finds a Postfix program on PATH or in /usr/sbin (not on a non-root PATH).
func sbin(t *testing.T, name string) string {
	t.Helper()
	if p, err := exec.LookPath(name); err == nil {
		return p
	}
	p := filepath.Join("/usr/sbin", name)
	if _, err := os.Stat(p); err != nil {
		t.Fatalf("%s is required by this test and is not installed (run scripts/install-test-deps)", name)
	}
	return p
}

// postfixInstance is a private Postfix run from its own configuration,
// queue and data directories. It binds no inet port (master.cf has no
// smtpd), so it coexists with any other instance on the machine.
type postfixInstance struct {
	cfg       string // config_directory, passed as -c
	maillog   string
	postfix   string
	sendmail  string
	postqueue string
}

// startPostfix starts a private Postfix whose every transport is LMTP to
// lmtpAddr and whose mydestination is domain. t.Cleanup stops it.
func startPostfix(t *testing.T, lmtpAddr, domain string) *postfixInstance {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Fatalf("the Postfix -> LMTP test must run as root (Postfix's master runs as root and drops to mail_owner); run the e2e suite as root, e.g. in CI")
	}
	pf := &postfixInstance{postfix: sbin(t, "postfix"), sendmail: sbin(t, "sendmail"), postqueue: sbin(t, "postqueue")}
	pw, err := user.Lookup("postfix")
	if err != nil {
		t.Fatalf("the postfix user is missing (is the postfix package installed?): %v", err)
	}
	uid, _ := strconv.Atoi(pw.Uid)
	gid, _ := strconv.Atoi(pw.Gid)

	// Postfix daemons run as the postfix user and must reach the queue:
	// the temp directories on the way must be searchable.
	root := t.TempDir()
	for d := root; d != os.TempDir() && d != "/" && d != "."; d = filepath.Dir(d) {
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	pf.cfg = filepath.Join(root, "etc")
	queue := filepath.Join(root, "queue")
	data := filepath.Join(root, "data")
	pf.maillog = filepath.Join(root, "maillog")
	for _, d := range []string{pf.cfg, queue, data} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Chown(data, uid, gid); err != nil {
		t.Fatal(err)
	}
	lmtp := "lmtp:inet:" + lmtpAddr
	mainCF := strings.Join([]string{
		"compatibility_level = 3.6",
		"config_directory = " + pf.cfg,
		"queue_directory = " + queue,
		"data_directory = " + data,
		"mail_owner = postfix",
		"setgid_group = postdrop",
		"maillog_file = " + pf.maillog,
		"maillog_file_prefixes = " + root,
		"myhostname = mta.e2e.test",
		"mydomain = e2e.test",
		"myorigin = $myhostname",
		"mydestination = " + domain,
		"inet_interfaces = loopback-only",
		"inet_protocols = ipv4",
		// Every destination goes to Quill over LMTP: the MTA-MDA structure.
		"default_transport = " + lmtp,
		"local_transport = " + lmtp,
		"virtual_transport = " + lmtp,
		"relay_transport = " + lmtp,
		// Quill decides which users exist; Postfix has no local tables.
		"local_recipient_maps =",
		"alias_maps =",
		"alias_database =",
		"append_dot_mydomain = no",
		"biff = no",
		"smtputf8_enable = no",
		"lmtp_tls_security_level = none",
		"delay_warning_time = 0",
		// Retry quickly: the test flushes the queue while it waits.
		"queue_run_delay = 1s",
		"minimal_backoff_time = 1s",
		"maximal_backoff_time = 2s",
		"lmtp_connect_timeout = 10s",
		"",
	}, "\n")
	// No "smtp inet" line: this instance listens on no TCP port.
	masterCF := strings.Join([]string{
		"pickup    unix  n       -       n       60      1       pickup",
		"cleanup   unix  n       -       n       -       0       cleanup",
		"qmgr      unix  n       -       n       300     1       qmgr",
		"rewrite   unix  -       -       n       -       -       trivial-rewrite",
		"bounce    unix  -       -       n       -       0       bounce",
		"defer     unix  -       -       n       -       0       bounce",
		"trace     unix  -       -       n       -       0       bounce",
		"verify    unix  -       -       n       -       1       verify",
		"flush     unix  n       -       n       1000?   0       flush",
		"proxymap  unix  -       -       n       -       -       proxymap",
		"showq     unix  n       -       n       -       -       showq",
		"error     unix  -       -       n       -       -       error",
		"retry     unix  -       -       n       -       -       error",
		"discard   unix  -       -       n       -       -       discard",
		"smtp      unix  -       -       n       -       -       smtp",
		"lmtp      unix  -       -       n       -       -       lmtp",
		"anvil     unix  -       -       n       -       1       anvil",
		"scache    unix  -       -       n       -       1       scache",
		"postlog   unix-dgram n  -       n       -       1       postlogd",
		"",
	}, "\n")
	if err := os.WriteFile(filepath.Join(pf.cfg, "main.cf"), []byte(mainCF), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(pf.cfg, "master.cf"), []byte(masterCF), 0o644); err != nil {
		t.Fatal(err)
	}

	t.Cleanup(func() {
		// Stop before Quill (cleanups run last-in first-out) and before the
		// temp directory goes; "stop" waits for master to exit.
		if out, err := pf.run(pf.postfix, "-c", pf.cfg, "stop"); err != nil && !strings.Contains(out, "not running") {
			t.Errorf("postfix stop: %v\n%s", err, out)
		}
		if t.Failed() {
			log, _ := os.ReadFile(pf.maillog)
			t.Logf("postfix maillog:\n%s", log)
		}
	})
	if out, err := pf.run(pf.postfix, "-c", pf.cfg, "start"); err != nil {
		log, _ := os.ReadFile(pf.maillog)
		t.Fatalf("postfix start: %v\n%s\nmaillog:\n%s", err, out, log)
	}
	return pf
}

// run runs one Postfix command with a bound on its time.
func (pf *postfixInstance) run(bin string, args ...string) (string, error) {
	return pf.runStdin(nil, bin, args...)
}

func (pf *postfixInstance) runStdin(stdin []byte, bin string, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), cliTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Env = append(os.Environ(), "MAIL_CONFIG="+pf.cfg)
	if stdin != nil {
		cmd.Stdin = bytes.NewReader(stdin)
	}
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	cmd.WaitDelay = killTimeout
	err := cmd.Run()
	if ctx.Err() != nil {
		err = fmt.Errorf("%s timed out: %w", filepath.Base(bin), err)
	}
	return out.String(), err
}

// inject queues msg through the instance's sendmail (and so postdrop).
func (pf *postfixInstance) inject(t *testing.T, from string, to []string, msg []byte) {
	t.Helper()
	// -i: a line with a single dot does not end the message.
	args := append([]string{"-C", pf.cfg, "-i", "-f", from, "--"}, to...)
	if out, err := pf.runStdin(bytes.ReplaceAll(msg, []byte("\r\n"), []byte("\n")), pf.sendmail, args...); err != nil {
		t.Fatalf("sendmail: %v\n%s", err, out)
	}
}

// TestPostfixLMTP puts a real Postfix in front of Quill's LMTP listener:
// a message for two users reaches both, and a recipient Quill does not
// know bounces (LMTP 550 5.1.1, RFC 2033) to the sender without holding
// up or duplicating the deliveries to the known ones.
func TestPostfixLMTP(t *testing.T) {
	s := startServer(t, Options{})
	const alice, alicePW = "alice@example.test", "pf-alice-pw"
	const bob, bobPW = "bob@example.test", "pf-bob-pass"
	const carol, carolPW = "carol@example.test", "pf-carol-pw"
	for u, p := range map[string]string{alice: alicePW, bob: bobPW, carol: carolPW} {
		addUser(t, s, u, p)
	}
	pf := startPostfix(t, s.Addr("lmtp"), s.Domain)

	tok1, tok2, tok3 := token(), token(), token()
	msg1 := testMessage(bob, alice, "postfix two recipients", tok1)
	pf.inject(t, bob, []string{alice, carol}, msg1)
	pf.inject(t, bob, []string{"nosuch@example.test"}, testMessage(bob, "nosuch@example.test", "postfix unknown", tok2))
	pf.inject(t, bob, []string{carol, "nosuch2@example.test"}, testMessage(bob, carol, "postfix mixed", tok3))

	// Done when both deliveries and both bounces are in Quill; postqueue
	// -f asks Postfix to retry anything deferred meanwhile.
	type box struct{ user, pw string }
	holds := func(b box, tok string, want int) error {
		msgs, err := fetchAll(s.Addr("pop3"), b.user, b.pw)
		if err != nil {
			return err
		}
		if n := len(findToken(msgs, tok)); n < want {
			return fmt.Errorf("%s holds %d messages with %s, want %d", b.user, n, tok, want)
		}
		return nil
	}
	eventually(t, postfixDeadline, "Postfix deliveries and bounces in Quill", func() error {
		if out, err := pf.run(pf.postqueue, "-c", pf.cfg, "-f"); err != nil {
			return fmt.Errorf("postqueue -f: %v: %s", err, out)
		}
		for _, c := range []struct {
			b    box
			tok  string
			want int
		}{
			{box{alice, alicePW}, tok1, 1},
			{box{carol, carolPW}, tok1, 1},
			{box{carol, carolPW}, tok3, 1},
			{box{bob, bobPW}, tok2, 1}, // the bounce quotes the original's Message-ID
			{box{bob, bobPW}, tok3, 1},
		} {
			if err := holds(c.b, c.tok, c.want); err != nil {
				return err
			}
		}
		return nil
	})

	// Exactly once each, byte for byte behind the trace fields.
	aliceMsgs := mustFetchAll(t, s.Addr("pop3"), alice, alicePW)
	if len(aliceMsgs) != 1 {
		t.Errorf("alice holds %d messages, want 1", len(aliceMsgs))
	} else if err := checkDelivered(aliceMsgs[0], msg1); err != nil {
		t.Errorf("alice: %v", err)
	}
	carolMsgs := mustFetchAll(t, s.Addr("pop3"), carol, carolPW)
	if len(carolMsgs) != 2 || len(findToken(carolMsgs, tok1)) != 1 || len(findToken(carolMsgs, tok3)) != 1 {
		t.Errorf("carol holds %d messages, want the two-recipient one and the mixed one once each", len(carolMsgs))
	}
	bobMsgs := mustFetchAll(t, s.Addr("pop3"), bob, bobPW)
	if len(bobMsgs) != 2 {
		t.Errorf("bob (the sender) holds %d messages, want 2 bounces", len(bobMsgs))
	}
	for _, tc := range []struct{ tok, rcpt string }{{tok2, "nosuch@example.test"}, {tok3, "nosuch2@example.test"}} {
		for _, m := range findToken(bobMsgs, tc.tok) {
			if !bytes.Contains(m, []byte("Return-Path: <>")) && !bytes.Contains(m, []byte("MAILER-DAEMON")) {
				t.Errorf("the message to bob about %s is not a bounce:\n%s", tc.rcpt, m)
			}
			if !bytes.Contains(m, []byte(tc.rcpt)) || !bytes.Contains(m, []byte("5.1.1")) {
				t.Errorf("the bounce does not name %s with status 5.1.1:\n%s", tc.rcpt, m)
			}
		}
	}
}
