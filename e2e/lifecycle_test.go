package e2e

import (
	"slices"
	"strings"
	"testing"
)

// requiredListeners are the listeners every quill serve must report when
// they are not turned off.
var requiredListeners = []string{"smtp", "submission", "submissions", "lmtp", "pop3", "pop3s", "admin"}

// uidl returns the UIDL listing of a maildrop, message order.
func uidl(t *testing.T, addr, user, pass string) []string {
	t.Helper()
	p, err := dialPOP3(addr, user, pass)
	if err != nil {
		t.Fatalf("POP3 login %s: %v", user, err)
	}
	defer p.Close()
	b, err := p.multi("UIDL")
	if err != nil {
		t.Fatalf("UIDL: %v", err)
	}
	var uids []string
	for _, l := range strings.Split(strings.TrimSpace(string(b)), "\r\n") {
		if f := strings.Fields(l); len(f) == 2 {
			uids = append(uids, f[1])
		}
	}
	if err := p.Quit(); err != nil {
		t.Fatalf("QUIT: %v", err)
	}
	return uids
}

// TestLifecycle covers the binary's contract around the protocols: the
// listener line, the user and alias CLI against a running server, LMTP
// and SMTP delivery, a graceful restart that keeps mail and UIDs, a clean
// `quill check` on the stopped store, and `quill version`.
func TestLifecycle(t *testing.T) {
	s := startServer(t, Options{})
	addrs := s.Addrs()
	for _, name := range requiredListeners {
		if _, ok := addrs[name]; !ok {
			t.Errorf("listener line lacks %q: %v", name, addrs)
		}
	}

	const dave, davePW = "dave@example.test", "lifecycle dave"
	addUser(t, s, dave, davePW)
	addAlias(t, s, "postmaster@example.test", dave)
	if out := mustQuill(t, "", "user", "list", "--data", s.DataDir); !strings.Contains(out, dave) {
		t.Errorf("user list lacks %s:\n%s", dave, out)
	}
	if out := mustQuill(t, "", "alias", "list", "--data", s.DataDir); !strings.Contains(out, "postmaster@example.test") {
		t.Errorf("alias list lacks postmaster@example.test:\n%s", out)
	}

	viaAlias, viaLMTP := token(), token()
	aliasMsg := testMessage("sender@remote.example", "postmaster@example.test", "via alias", viaAlias)
	if err := smtpSend(s.Addr("smtp"), false, "sender@remote.example", []string{"postmaster@example.test"}, aliasMsg); err != nil {
		t.Fatalf("SMTP to the alias: %v", err)
	}
	lmtpMsg := testMessage("sender@remote.example", dave, "via LMTP", viaLMTP)
	if err := smtpSend(s.Addr("lmtp"), true, "sender@remote.example", []string{dave}, lmtpMsg); err != nil {
		t.Fatalf("LMTP: %v", err)
	}
	msgs := mustFetchAll(t, s.Addr("pop3"), dave, davePW)
	for tok, want := range map[string][]byte{viaAlias: aliasMsg, viaLMTP: lmtpMsg} {
		got := findToken(msgs, tok)
		if len(got) != 1 {
			t.Fatalf("dave holds %d copies of %s, want 1", len(got), tok)
		}
		if err := checkDelivered(got[0], want); err != nil {
			t.Error(err)
		}
	}

	// POP3S answers over implicit TLS.
	c, err := dialTLS(s.Addr("pop3s"))
	if err != nil {
		t.Fatalf("POP3S: %v", err)
	}
	if line, err := c.readLine(); err != nil || !strings.HasPrefix(line, "+OK") {
		t.Errorf("POP3S greeting %q, %v", line, err)
	}
	c.Close()

	// A graceful restart keeps the mail and its UIDs (RFC 1939 section 7:
	// UIDs persist across sessions).
	before := uidl(t, s.Addr("pop3"), dave, davePW)
	s.Restart(t)
	if after := uidl(t, s.Addr("pop3"), dave, davePW); !slices.Equal(before, after) {
		t.Errorf("UIDs changed across a restart: %v then %v", before, after)
	}

	s.Stop(t)
	if out, err := Quill(t, "", "check", "--data", s.DataDir); err != nil {
		t.Errorf("quill check after a clean stop: %v\n%s", err, out)
	}
	// The CLI works on a stopped server too.
	addUser(t, s, "erin@example.test", "erin password")
	s.Restart(t)
	if _, err := fetchAll(s.Addr("pop3"), "erin@example.test", "erin password"); err != nil {
		t.Errorf("user added while stopped cannot log in: %v", err)
	}

	if out := mustQuill(t, "", "version"); strings.TrimSpace(out) == "" {
		t.Error("quill version printed nothing")
	}
}

// TestListenersOff: a listener given as "off" is neither bound nor
// reported, also after a SIGKILL and a restart on the same data.
func TestListenersOff(t *testing.T) {
	s := startServer(t, Options{Listen: map[string]string{"pop3s": "off", "submissions": "off", "imaps": "off"}})
	addrs := s.Addrs()
	for _, off := range []string{"pop3s", "submissions", "imaps"} {
		if a, ok := addrs[off]; ok {
			t.Errorf("%s is off but reported at %s", off, a)
		}
	}
	for _, on := range []string{"smtp", "pop3", "lmtp"} {
		if _, ok := addrs[on]; !ok {
			t.Errorf("%s not reported: %v", on, addrs)
		}
	}
	s.Kill()
	if s.Running() {
		t.Fatal("still running after Kill")
	}
	s.Restart(t)
	if _, ok := s.Addrs()["pop3s"]; ok || !s.Running() {
		t.Errorf("after Kill and Restart: running %v, listeners %v", s.Running(), s.Addrs())
	}
}
