package e2e

import (
	"fmt"
	"os"
	"strings"
	"testing"
	"time"
)

// TestCassandraIMAPAcrossNodes: two Quill nodes on one keyspace. An IMAP
// session on node A sees a delivery made through node B while it idles
// (the change-log poll, store.cassandra.idle_poll), and a flag change made
// by a session on node B at its next command.
func TestCassandraIMAPAcrossNodes(t *testing.T) {
	c := useCassandra(t)
	cfg := c.config(t, fmt.Sprintf("e2e_imap_%d", os.Getpid()), "idle_poll = \"200ms\"\n")
	a := startServer(t, Options{ConfigFile: cfg})
	b := startServer(t, Options{ConfigFile: cfg})
	const user, pass = "idler@example.test", "idler-password-1"
	addUser(t, a, user, pass)

	sa := dialIMAP(t, a.Addr("imap"), user, pass)
	sa.run(t, "SELECT INBOX")
	_ = sa.conn.SetDeadline(time.Now().Add(60 * time.Second))
	if _, err := fmt.Fprintf(sa.conn, "i1 IDLE\r\n"); err != nil {
		t.Fatal(err)
	}
	if line, err := sa.r.ReadString('\n'); err != nil || !strings.HasPrefix(line, "+") {
		t.Fatalf("IDLE: %q, %v", line, err)
	}
	tok := token()
	msg := testMessage("sender@remote.test", user, "across nodes "+tok, tok)
	if err := smtpSend(b.Addr("smtp"), false, "sender@remote.test", []string{user}, msg); err != nil {
		t.Fatal(err)
	}
	// The push must come from the poll: node A's hub never heard of it.
	for {
		line, err := sa.r.ReadString('\n')
		if err != nil {
			t.Fatalf("waiting in IDLE on node A for a delivery through node B: %v", err)
		}
		if strings.HasSuffix(strings.TrimSpace(line), "EXISTS") {
			if !strings.HasPrefix(line, "* 1 EXISTS") {
				t.Fatalf("IDLE pushed %q, want * 1 EXISTS", line)
			}
			break
		}
	}
	if _, err := fmt.Fprintf(sa.conn, "DONE\r\n"); err != nil {
		t.Fatal(err)
	}
	for {
		line, err := sa.r.ReadString('\n')
		if err != nil {
			t.Fatal(err)
		}
		if strings.HasPrefix(line, "i1 ") {
			if !strings.HasPrefix(line, "i1 OK") {
				t.Fatalf("IDLE ended with %q", line)
			}
			break
		}
	}

	sb := dialIMAP(t, b.Addr("imap"), user, pass)
	sb.run(t, "SELECT INBOX")
	sb.run(t, `STORE 1 +FLAGS (\Flagged)`)
	seen := false
	for _, line := range sa.run(t, "NOOP") {
		if strings.HasPrefix(line, "* 1 FETCH") && strings.Contains(line, `\Flagged`) {
			seen = true
		}
	}
	if !seen {
		t.Fatal(`node A's session did not see node B's \Flagged at its next command`)
	}
}
