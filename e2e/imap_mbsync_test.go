package e2e

import (
	"bufio"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"
	"time"
)

// TestIMAPMbsync drives mbsync (Debian isync) against the real binary: a
// full two-way sync of a mailbox tree with flags and deletions on both
// sides, each sync followed by a second that must be a no-op, checked
// with mbsync's own counters and by the server's HIGHESTMODSEQ and
// contents.
func TestIMAPMbsync(t *testing.T) {
	mbsync := requireTool(t, "mbsync")
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
	local := t.TempDir()
	writeMaildirMsg(t, filepath.Join(local, "Projects", "Alpha"), "alpha1", "",
		"From: alice@example.org\r\nSubject: alpha plan\r\nMessage-ID: <alpha1@example.org>\r\n\r\nplan\r\n")
	writeMaildirMsg(t, filepath.Join(local, "Projects", "Beta"), "beta1", "S",
		"From: alice@example.org\r\nSubject: beta notes\r\nMessage-ID: <beta1@example.org>\r\n\r\nnotes\r\n")
	rc := filepath.Join(t.TempDir(), "mbsyncrc")
	host, p := "127.0.0.1", port(t, s.Addr("imap"))
	conf := fmt.Sprintf(`IMAPAccount quill
Host %s
Port %s
User %s
Pass "%s"
SSLType None
AuthMechs LOGIN

IMAPStore remote
Account quill

MaildirStore local
Path %s/
Inbox %s/INBOX
SubFolders Verbatim

Channel sync
Far :remote:
Near :local:
Patterns *
Create Both
Expunge Both
SyncState *
Sync All
`, host, p, user, pass, local, local)
	if err := os.WriteFile(rc, []byte(conf), 0o600); err != nil {
		t.Fatal(err)
	}
	run := func(what string) mbsyncStats {
		t.Helper()
		cmd := exec.Command(mbsync, "-Dn", "-c", rc, "sync")
		cmd.Env = append(os.Environ(), "HOME="+t.TempDir())
		out, err := runBounded(cmd, 2*time.Minute)
		if err != nil {
			t.Fatalf("mbsync (%s): %v\n%s", what, err, out)
		}
		st, ok := parseMbsyncStats(out)
		if !ok {
			t.Fatalf("mbsync (%s): no protocol trace in output:\n%s", what, out)
		}
		t.Logf("mbsync (%s): %+v", what, st)
		return st
	}

	c := dialIMAP(t, s.Addr("imap"), user, pass)

	// First sync: INBOX down, the local tree up.
	st := run("initial")
	if st.downloads != 3 || st.appends != 2 {
		t.Errorf("initial sync: want 3 messages down and 2 up, got %+v", st)
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
	assertNoop(t, c, local, run, "after initial sync")

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
	if st.downloads != 1 || st.stores < 1 || st.deletes < 1 {
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
		if strings.HasSuffix(f, ":2,R") || strings.Contains(filepath.Base(f), ",R") {
			answered = true
		}
	}
	if !answered {
		t.Errorf("\\Answered did not reach the local INBOX")
	}
	assertNoop(t, c, local, run, "after the changes")
}

// assertNoop runs mbsync again and requires that it changes nothing: by
// its own protocol trace, by the server's HIGHESTMODSEQ of every mailbox,
// and by the local maildirs' file names (which carry the flags).
func assertNoop(t *testing.T, c *imapConn, local string, run func(string) mbsyncStats, what string) {
	t.Helper()
	before, localBefore := c.modseqs(t), maildirTree(t, local)
	st := run("no-op " + what)
	if st != (mbsyncStats{}) {
		t.Errorf("sync %s was not a no-op: %+v", what, st)
	}
	if after := c.modseqs(t); after != before {
		t.Errorf("sync %s changed the server:\nbefore %s\nafter  %s", what, before, after)
	}
	if after := maildirTree(t, local); after != localBefore {
		t.Errorf("sync %s changed the maildirs:\nbefore %s\nafter  %s", what, localBefore, after)
	}
}

// maildirTree lists every message file under root, relative and sorted.
func maildirTree(t *testing.T, root string) string {
	t.Helper()
	var out []string
	err := filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if dir := filepath.Base(filepath.Dir(p)); !d.IsDir() && (dir == "cur" || dir == "new") {
			rel, _ := filepath.Rel(root, p)
			out = append(out, rel)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	sort.Strings(out)
	return strings.Join(out, "\n")
}

// mbsyncStats count what mbsync did to the server, from its own protocol
// trace (-Dn; mbsync 1.4 prints no summary when not on a terminal):
// messages uploaded, flag changes pushed, messages marked deleted,
// expunges (mbsync mostly expunges by CLOSE, which is not counted), and
// message bodies downloaded.
type mbsyncStats struct {
	appends, stores, deletes, expunges, downloads int
}

var (
	// Pipelined commands are traced as "(n in progress) >>> tag ...".
	mbsyncCmd  = regexp.MustCompile(`(?m)^(?:\(\d+ in progress\) )?>>> \d+ (APPEND|UID STORE|UID EXPUNGE|EXPUNGE)(.*)$`)
	mbsyncBody = regexp.MustCompile(`(?m)^\* \d+ FETCH \(.*BODY\[\] \{`)
)

func parseMbsyncStats(out string) (mbsyncStats, bool) {
	if !strings.Contains(out, ">>> 1 LOGIN") {
		return mbsyncStats{}, false
	}
	var st mbsyncStats
	for _, m := range mbsyncCmd.FindAllStringSubmatch(out, -1) {
		switch {
		case m[1] == "APPEND":
			st.appends++
		case m[1] == "UID STORE" && strings.Contains(m[2], `+FLAGS.SILENT (\Deleted)`):
			st.deletes++
		case m[1] == "UID STORE":
			st.stores++
		default:
			st.expunges++
		}
	}
	st.downloads = len(mbsyncBody.FindAllString(out, -1))
	return st, true
}

// runBounded runs cmd with its combined output, killing it after d.
func runBounded(cmd *exec.Cmd, d time.Duration) (string, error) {
	var out strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		return "", err
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		return out.String(), err
	case <-time.After(d):
		_ = cmd.Process.Kill()
		<-done
		return out.String(), fmt.Errorf("killed after %v", d)
	}
}

func writeMaildirMsg(t *testing.T, dir, name, flags, body string) {
	t.Helper()
	for _, sub := range []string{"cur", "new", "tmp"} {
		if err := os.MkdirAll(filepath.Join(dir, sub), 0o700); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(dir, "cur", name+":2,"+flags), []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
}

// maildirFiles lists a maildir's messages (cur and new).
func maildirFiles(t *testing.T, dir string) []string {
	t.Helper()
	var out []string
	for _, sub := range []string{"cur", "new"} {
		ents, err := os.ReadDir(filepath.Join(dir, sub))
		if err != nil && !os.IsNotExist(err) {
			t.Fatal(err)
		}
		for _, e := range ents {
			out = append(out, filepath.Join(dir, sub, e.Name()))
		}
	}
	return out
}

// setMaildirFlags renames a maildir message so its info carries flags.
func setMaildirFlags(t *testing.T, path, flags string) {
	t.Helper()
	dir := filepath.Join(filepath.Dir(filepath.Dir(path)), "cur")
	base, _, _ := strings.Cut(filepath.Base(path), ":2,")
	if err := os.Rename(path, filepath.Join(dir, base+":2,"+flags)); err != nil {
		t.Fatal(err)
	}
}

func sortBySubject(t *testing.T, files []string) {
	t.Helper()
	order := map[string]int{"one": 1, "two": 2, "three": 3, "four": 4}
	subj := map[string]int{}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		m := regexp.MustCompile(`(?m)^Subject: (\w+)`).FindSubmatch(b)
		if m != nil {
			subj[f] = order[string(m[1])]
		}
	}
	sort.Slice(files, func(i, j int) bool { return subj[files[i]] < subj[files[j]] })
}

// imapConn is a minimal IMAP client for inspecting the server's state:
// commands whose responses carry no literals.
type imapConn struct {
	conn net.Conn
	r    *bufio.Reader
	tag  int
}

func dialIMAP(t *testing.T, addr, user, pass string) *imapConn {
	t.Helper()
	nc, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { nc.Close() })
	c := &imapConn{conn: nc, r: bufio.NewReader(nc)}
	if _, err := c.r.ReadString('\n'); err != nil {
		t.Fatal(err)
	}
	c.run(t, fmt.Sprintf("LOGIN %q %q", user, pass))
	return c
}

// run sends one command and returns its untagged responses, failing the
// test unless it ends in OK.
func (c *imapConn) run(t *testing.T, cmd string) []string {
	t.Helper()
	c.tag++
	tag := fmt.Sprintf("t%d", c.tag)
	_ = c.conn.SetDeadline(time.Now().Add(30 * time.Second))
	if _, err := fmt.Fprintf(c.conn, "%s %s\r\n", tag, cmd); err != nil {
		t.Fatal(err)
	}
	var out []string
	for {
		line, err := c.r.ReadString('\n')
		if err != nil {
			t.Fatalf("%s: %v", cmd, err)
		}
		line = strings.TrimRight(line, "\r\n")
		if strings.HasPrefix(line, tag+" ") {
			if !strings.HasPrefix(line, tag+" OK") {
				t.Fatalf("%s: %s", cmd, line)
			}
			return out
		}
		out = append(out, line)
	}
}

var (
	subjectRE = regexp.MustCompile(`^\* \d+ FETCH \(UID \d+ ENVELOPE \((?:NIL|"[^"]*") "([^"]*)"`)
	flagsRE   = regexp.MustCompile(`^\* \d+ FETCH \(UID \d+ FLAGS \(([^)]*)\)\)`)
	modseqRE  = regexp.MustCompile(`^\* LIST .* "/" (\S+)$|^\* STATUS (\S+) \(HIGHESTMODSEQ (\d+) MESSAGES (\d+)\)`)
)

// subjects returns the subjects of a mailbox's messages in UID order.
func (c *imapConn) subjects(t *testing.T, mbox string) []string {
	t.Helper()
	c.run(t, "EXAMINE "+mbox)
	var out []string
	for _, l := range c.run(t, "UID FETCH 1:* ENVELOPE") {
		if m := subjectRE.FindStringSubmatch(l); m != nil {
			out = append(out, m[1])
		}
	}
	c.run(t, "UNSELECT")
	return out
}

// flags returns the flags of a mailbox's messages in UID order.
func (c *imapConn) flags(t *testing.T, mbox string) []string {
	t.Helper()
	c.run(t, "EXAMINE "+mbox)
	var out []string
	for _, l := range c.run(t, "UID FETCH 1:* FLAGS") {
		if m := flagsRE.FindStringSubmatch(l); m != nil {
			out = append(out, m[1])
		}
	}
	c.run(t, "UNSELECT")
	return out
}

// modseqs renders every mailbox's HIGHESTMODSEQ and message count, by
// LIST-STATUS.
func (c *imapConn) modseqs(t *testing.T) string {
	t.Helper()
	var out []string
	for _, l := range c.run(t, `LIST "" "*" RETURN (STATUS (HIGHESTMODSEQ MESSAGES))`) {
		if m := modseqRE.FindStringSubmatch(l); m != nil && m[2] != "" {
			out = append(out, m[2]+"="+m[3]+"/"+m[4])
		}
	}
	return strings.Join(out, " ")
}
