package imap

import (
	"net/netip"
	"strings"
	"testing"

	"quill/internal/store/embedded"
	"quill/internal/store/storetest"
)

// TestWriteOfUnknownOutcome: every write whose outcome the store cannot
// tell (store.ErrOutcomeUnknown, injected after the real engine applied
// the batch) is answered with an untagged BYE [UNAVAILABLE] and the
// connection closes, with no tagged response; on a new connection the
// write is visible.
func TestWriteOfUnknownOutcome(t *testing.T) {
	cases := []struct {
		name  string
		setup []string // commands after SELECT INBOX, each answered OK
		cmd   string
		// checks are commands on a new connection and what their
		// responses must contain.
		checks [][2]string
	}{
		{name: "APPEND", cmd: "a APPEND Archive {13+}<CRLF>Subject: new<CRLF>",
			checks: [][2]string{{"c STATUS Archive (MESSAGES)", "(MESSAGES 1)"}}},
		{name: "STORE", cmd: `a STORE 1 +FLAGS (\Flagged)`,
			checks: [][2]string{{"c EXAMINE INBOX", "c OK"}, {"c FETCH 1 FLAGS", `\Flagged`}}},
		{name: "FETCH setting \\Seen", cmd: "a FETCH 2 BODY[TEXT]",
			checks: [][2]string{{"c EXAMINE INBOX", "c OK"}, {"c FETCH 2 FLAGS", `\Seen`}}},
		{name: "EXPUNGE", setup: []string{`s STORE 1 +FLAGS.SILENT (\Deleted)`}, cmd: "a EXPUNGE",
			checks: [][2]string{{"c STATUS INBOX (MESSAGES)", "(MESSAGES 2)"}}},
		{name: "UID EXPUNGE", setup: []string{`s STORE 1:2 +FLAGS.SILENT (\Deleted)`}, cmd: "a UID EXPUNGE 2",
			checks: [][2]string{{"c STATUS INBOX (MESSAGES)", "(MESSAGES 2)"}}},
		{name: "CLOSE", setup: []string{`s STORE 3 +FLAGS.SILENT (\Deleted)`}, cmd: "a CLOSE",
			checks: [][2]string{{"c STATUS INBOX (MESSAGES)", "(MESSAGES 2)"}}},
		{name: "COPY", cmd: "a COPY 1:2 Trash",
			checks: [][2]string{{"c STATUS Trash (MESSAGES)", "(MESSAGES 2)"}}},
		{name: "MOVE", cmd: "a UID MOVE 3 Trash",
			checks: [][2]string{{"c STATUS Trash (MESSAGES)", "(MESSAGES 1)"}, {"c STATUS INBOX (MESSAGES)", "(MESSAGES 2)"}}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			e, err := embedded.Open(t.TempDir(), embedded.Options{})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { e.Close() })
			u := storetest.NewUncertain(e)
			b := newTestBackendOn(t, u)
			addr := startServer(t, &Server{Hostname: "imap.test", Backend: b, Logger: testLogger(t)}, netip.Addr{})
			c := dial(t, addr, nil)
			c.readLines()
			c.command("l LOGIN alice secret")
			if got := c.command("x SELECT INBOX"); !strings.HasPrefix(got[len(got)-1], "x OK") {
				t.Fatalf("SELECT: %q", got)
			}
			for _, cmd := range tc.setup {
				if got := c.command(cmd); !strings.HasPrefix(got[len(got)-1], "s OK") {
					t.Fatalf("%s: %q", cmd, got)
				}
			}
			u.Arm(1)
			got := c.command(tc.cmd)
			if u.Injected() != 1 {
				t.Fatalf("%s: %d batches reported unknown, want 1; got %q", tc.cmd, u.Injected(), got)
			}
			if len(got) < 2 || got[len(got)-1] != "<EOF>" || !strings.HasPrefix(got[len(got)-2], "* BYE [UNAVAILABLE] ") {
				t.Fatalf("%s: %q, want * BYE [UNAVAILABLE] and the connection closed", tc.cmd, got)
			}
			for _, l := range got {
				if strings.HasPrefix(l, "a ") {
					t.Fatalf("%s: tagged response %q to a write of unknown outcome", tc.cmd, l)
				}
			}
			// A new connection sees the write.
			c = dial(t, addr, nil)
			c.readLines()
			c.command("l LOGIN alice secret")
			for _, ck := range tc.checks {
				got := c.command(ck[0])
				if all := strings.Join(got, "\n"); !strings.Contains(all, ck[1]) || !strings.HasPrefix(got[len(got)-1], "c OK") {
					t.Fatalf("after reconnecting, %s: %q, want %s", ck[0], got, ck[1])
				}
			}
		})
	}
}
