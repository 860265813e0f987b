package e2e

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"
)

// TestCassandraPOP3MaildropLease: with engine = "cassandra" a POP3
// maildrop is locked across Quill nodes (RFC 1939 section 8; the lease of
// store.MaildropLocker): a session on a second node gets -ERR [IN-USE]
// (RFC 2449 section 8.1.2) while one on the first holds it, gets in once
// the first QUITs, and, when the holder's node is killed with SIGKILL,
// gets in once the dead session's lease term has run out.
func TestCassandraPOP3MaildropLease(t *testing.T) {
	c := useCassandra(t)
	const term = 3 * time.Second
	cfg := c.config(t, fmt.Sprintf("pop3lease_%d", os.Getpid()), fmt.Sprintf("maildrop_lease = %q\n", term.String()))
	a := startServer(t, Options{ConfigFile: cfg})
	b := startServer(t, Options{ConfigFile: cfg})
	const user, pass = "drop@example.test", "drop-password-1"
	addUser(t, a, user, pass)
	msg := testMessage("sender@remote.test", user, "lease", token())
	if err := smtpSend(a.Addr("smtp"), false, "sender@remote.test", []string{user}, msg); err != nil {
		t.Fatal(err)
	}

	inUse := func(addr string) error {
		p, err := dialPOP3(addr, user, pass)
		if err == nil {
			p.Quit()
			return errors.New("second session logged in while the maildrop was held")
		}
		var perr *POP3Error
		if !errors.As(err, &perr) || !strings.HasPrefix(perr.Text, "[IN-USE]") {
			return fmt.Errorf("second session: %v, want -ERR [IN-USE]", err)
		}
		return nil
	}

	first, err := dialPOP3(a.Addr("pop3"), user, pass)
	if err != nil {
		t.Fatalf("first session on node a: %v", err)
	}
	if err := inUse(b.Addr("pop3")); err != nil {
		t.Fatalf("node b while node a holds the maildrop: %v", err)
	}
	// The holder keeps the maildrop past several terms by renewing it.
	for start := time.Now(); time.Since(start) < 2*term; time.Sleep(term / 2) {
		if n, _, err := first.Stat(); err != nil || n != 1 {
			t.Fatalf("first session STAT: %d messages, %v", n, err)
		}
		if err := inUse(b.Addr("pop3")); err != nil {
			t.Fatalf("node b %v into node a's session: %v", time.Since(start).Round(time.Millisecond), err)
		}
	}
	if err := first.Quit(); err != nil {
		t.Fatal(err)
	}
	second, err := dialPOP3(b.Addr("pop3"), user, pass)
	if err != nil {
		t.Fatalf("node b after node a's session QUIT: %v", err)
	}
	if err := second.Quit(); err != nil {
		t.Fatal(err)
	}

	// A holder that dies without QUIT keeps the maildrop until its lease
	// term runs out, no longer.
	held, err := dialPOP3(a.Addr("pop3"), user, pass)
	if err != nil {
		t.Fatalf("session on node a: %v", err)
	}
	defer held.Close()
	a.Kill()
	killed := time.Now()
	if err := inUse(b.Addr("pop3")); err != nil {
		t.Fatalf("node b right after node a died holding the maildrop: %v", err)
	}
	eventually(t, term+30*time.Second, "node b logs in after the dead session's lease expired", func() error {
		p, err := dialPOP3(b.Addr("pop3"), user, pass)
		if err != nil {
			return err
		}
		return p.Quit()
	})
	t.Logf("node b got the maildrop %v after node a was killed (lease term %v)", time.Since(killed).Round(time.Millisecond), term)
}
