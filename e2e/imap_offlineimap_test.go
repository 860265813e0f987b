package e2e

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
)

// TestIMAPOfflineimap drives offlineimap (Debian) against the real binary,
// as TestIMAPMbsync does mbsync: a two-way sync of a folder tree with
// flags and deletions on both sides, each sync followed by a second that
// must be a no-op by offlineimap's own log, by the server's HIGHESTMODSEQ
// of every mailbox and by the local maildirs' file names.
func TestIMAPOfflineimap(t *testing.T) {
	offlineimap := requireTool(t, "offlineimap")
	s := startServer(t, Options{})
	user := "alice@" + s.Domain
	const pass = "correct horse battery"
	addUser(t, s, user, pass)
	for _, subj := range []string{"one", "two", "three"} {
		msg := fmt.Sprintf("From: bob@example.org\r\nTo: %s\r\nSubject: %s\r\nMessage-ID: <%s@example.org>\r\n\r\nbody %s\r\n", user, subj, subj, subj)
		if err := smtpSend(s.Addr("smtp"), false, "bob@example.org", []string{user}, []byte(msg)); err != nil {
			t.Fatalf("SMTP: %v", err)
		}
	}

	// The local side starts with a folder tree of its own to upload.
	dir := t.TempDir()
	local := filepath.Join(dir, "mail")
	writeMaildirMsg(t, filepath.Join(local, "Projects", "Alpha"), "alpha1", "",
		"From: alice@example.org\r\nSubject: alpha plan\r\nMessage-ID: <alpha1@example.org>\r\n\r\nplan\r\n")
	writeMaildirMsg(t, filepath.Join(local, "Projects", "Beta"), "beta1", "S",
		"From: alice@example.org\r\nSubject: beta notes\r\nMessage-ID: <beta1@example.org>\r\n\r\nnotes\r\n")
	// offlineimap's Maildir repository needs every folder, parents
	// included, to be a maildir: Projects exists on the server once the
	// children are created there, so it must exist here too.
	for _, sub := range []string{"cur", "new", "tmp"} {
		if err := os.MkdirAll(filepath.Join(local, "Projects", sub), 0o700); err != nil {
			t.Fatal(err)
		}
	}
	rc := filepath.Join(dir, "offlineimaprc")
	conf := fmt.Sprintf(`[general]
accounts = quill
metadata = %s/meta
ui = basic

[Account quill]
localrepository = local
remoterepository = remote

[Repository local]
type = Maildir
localfolders = %s
sep = /

[Repository remote]
type = IMAP
remotehost = 127.0.0.1
remoteport = %s
remoteuser = %s
remotepass = %s
ssl = no
starttls = no
maxconnections = 1
`, dir, local, port(t, s.Addr("imap")), user, pass)
	if err := os.WriteFile(rc, []byte(conf), 0o600); err != nil {
		t.Fatal(err)
	}
	home := t.TempDir()
	run := func(what string) offlineimapStats {
		t.Helper()
		cmd := exec.Command(offlineimap, "-o", "-1", "-c", rc)
		cmd.Env = append(os.Environ(), "HOME="+home)
		out, err := runBounded(cmd, 2*time.Minute)
		if err != nil {
			t.Fatalf("offlineimap (%s): %v\n%s", what, err, out)
		}
		st, ok := parseOfflineimapStats(out)
		if !ok {
			t.Fatalf("offlineimap (%s): failed or no sync in output:\n%s", what, out)
		}
		t.Logf("offlineimap (%s): %+v", what, st)
		return st
	}

	c := dialIMAP(t, s.Addr("imap"), user, pass)

	// First sync: INBOX down, the local tree up.
	st := run("initial")
	if st.copies != 5 {
		t.Errorf("initial sync: want 5 messages copied (3 down, 2 up), got %+v", st)
	}
	if got := c.subjects(t, "Projects/Alpha"); strings.Join(got, ",") != "alpha plan" {
		t.Errorf("server Projects/Alpha = %q", got)
	}
	if got := c.flags(t, "Projects/Beta"); strings.Join(got, ",") != `\Seen` {
		t.Errorf("server Projects/Beta flags = %q, want \\Seen", got)
	}
	if n := len(maildirFiles(t, filepath.Join(local, "INBOX"))); n != 3 {
		t.Errorf("local INBOX has %d messages, want 3", n)
	}
	assertOfflineimapNoop(t, c, local, run, "after initial sync")

	// Changes on both sides: locally, flag one message and delete one;
	// on the server, answer one, delete another and deliver a new one.
	files := maildirFiles(t, filepath.Join(local, "INBOX"))
	sortBySubject(t, files)
	setMaildirFlags(t, files[0], "FS")          // "one": \Flagged \Seen
	if err := os.Remove(files[1]); err != nil { // "two": deleted
		t.Fatal(err)
	}
	c.run(t, "SELECT INBOX")
	c.run(t, "UID STORE 3 +FLAGS (\\Answered)") // "three"
	c.run(t, "SELECT Projects/Alpha")
	c.run(t, "UID STORE 1 +FLAGS (\\Deleted)")
	c.run(t, "EXPUNGE")
	c.run(t, "UNSELECT")
	if err := smtpSend(s.Addr("smtp"), false, "bob@example.org", []string{user},
		[]byte("From: bob@example.org\r\nSubject: four\r\nMessage-ID: <four@example.org>\r\n\r\nbody four\r\n")); err != nil {
		t.Fatalf("SMTP: %v", err)
	}

	st = run("changes")
	if st.copies != 1 || st.flagChanges < 2 || st.deletes < 2 {
		t.Errorf("second sync missed changes: %+v", st)
	}
	if got := c.subjects(t, "INBOX"); strings.Join(got, ",") != "one,three,four" {
		t.Errorf("server INBOX = %q, want one,three,four", got)
	}
	if got := c.flags(t, "INBOX"); strings.Join(got, ";") != `\Flagged \Seen;\Answered;` {
		t.Errorf("server INBOX flags = %q", got)
	}
	if got := c.subjects(t, "Projects/Alpha"); len(got) != 0 {
		t.Errorf("server Projects/Alpha = %q, want empty", got)
	}
	if n := len(maildirFiles(t, filepath.Join(local, "INBOX"))); n != 3 {
		t.Errorf("local INBOX has %d messages, want 3", n)
	}
	if n := len(maildirFiles(t, filepath.Join(local, "Projects", "Alpha"))); n != 0 {
		t.Errorf("local Projects/Alpha has %d messages, want 0", n)
	}
	answered := false
	for _, f := range maildirFiles(t, filepath.Join(local, "INBOX")) {
		if _, info, ok := strings.Cut(filepath.Base(f), ":2,"); ok && strings.Contains(info, "R") {
			answered = true
		}
	}
	if !answered {
		t.Errorf("\\Answered did not reach the local INBOX")
	}
	assertOfflineimapNoop(t, c, local, run, "after the changes")
}

// assertOfflineimapNoop runs offlineimap again and requires that it
// changes nothing: by its own log, by the server's HIGHESTMODSEQ of every
// mailbox, and by the local maildirs' file names (which carry the flags).
func assertOfflineimapNoop(t *testing.T, c *imapConn, local string, run func(string) offlineimapStats, what string) {
	t.Helper()
	before, localBefore := c.modseqs(t), maildirTree(t, local)
	st := run("no-op " + what)
	if st != (offlineimapStats{}) {
		t.Errorf("sync %s was not a no-op: %+v", what, st)
	}
	if after := c.modseqs(t); after != before {
		t.Errorf("sync %s changed the server:\nbefore %s\nafter  %s", what, before, after)
	}
	if after := maildirTree(t, local); after != localBefore {
		t.Errorf("sync %s changed the maildirs:\nbefore %s\nafter  %s", what, localBefore, after)
	}
}

// offlineimapStats count what offlineimap did, from its basic UI's log:
// messages copied (either way), flag additions and removals, and message
// deletions (either way).
type offlineimapStats struct {
	copies, flagChanges, deletes int
}

var (
	offlineimapCopy   = regexp.MustCompile(`(?m)^Copy message `)
	offlineimapFlags  = regexp.MustCompile(`(?m)^(Adding|Removing) flags? `)
	offlineimapDelete = regexp.MustCompile(`(?m)^Deleting \d+ messages? `)
	// offlineimapError is how offlineimap reports a failed folder or
	// account while still exiting 0.
	offlineimapError = regexp.MustCompile(`(?m)^ ?ERROR|^Traceback|Finished with \d+ errors`)
)

func parseOfflineimapStats(out string) (offlineimapStats, bool) {
	if offlineimapError.MatchString(out) || !strings.Contains(out, "Finished") && !strings.Contains(out, "Syncing") {
		return offlineimapStats{}, false
	}
	return offlineimapStats{
		copies:      len(offlineimapCopy.FindAllString(out, -1)),
		flagChanges: len(offlineimapFlags.FindAllString(out, -1)),
		deletes:     len(offlineimapDelete.FindAllString(out, -1)),
	}, true
}
