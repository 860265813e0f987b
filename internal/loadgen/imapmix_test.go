package loadgen

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"testing"
	"time"
)

// scriptConn is a connection whose peer's every response is known in
// advance: reads come from the script, writes are recorded. It suits a
// lock-step client, whose commands never depend on timing.
type scriptConn struct {
	net.Conn // unused methods panic
	in       io.Reader
	out      bytes.Buffer
}

func (c *scriptConn) Read(p []byte) (int, error)                                    { return c.in.Read(p) }
func (c *scriptConn) Write(p []byte) (int, error)                                   { return c.out.Write(p) }
func (c *scriptConn) Close() error                                                  { return nil }
func (c *scriptConn) SetDeadline(time.Time) error                                   { return nil }
func (c *scriptConn) SetReadDeadline(time.Time) error                               { return nil }
func (c *scriptConn) SetWriteDeadline(time.Time) error                              { return nil }
func (c *scriptConn) DialContext(context.Context, string, string) (net.Conn, error) { return c, nil }

func newScriptReader(s string) *imapReader {
	return &imapReader{r: bufio.NewReaderSize(strings.NewReader(s), maxIMAPLine+2)}
}

func TestIMAPResponseReader(t *testing.T) {
	// A literal holding CRLF and a line that looks like our tagged reply.
	tricky := "line\r\na1 OK not the end\r\n"
	in := "* 2 EXISTS\r\n" +
		"* 1 FETCH (UID 7 BODY[] {0}\r\n)\r\n" +
		fmt.Sprintf("* 2 FETCH (UID 9 BODY[] {%d}\r\n%s)\r\n", len(tricky), tricky) +
		"* 3 FETCH (ENVELOPE (\"d\" {5+}\r\nhello NIL ~{2}\r\nxy))\r\n" +
		"* OK [ALERT] status text ending {3}\r\n" +
		"a1 OK done {4}\r\n"
	type resp struct{ lines, lits []string }
	want := []resp{
		{lines: []string{"* 2 EXISTS"}},
		{lines: []string{"* 1 FETCH (UID 7 BODY[] {0}", ")"}, lits: []string{""}},
		{lines: []string{fmt.Sprintf("* 2 FETCH (UID 9 BODY[] {%d}", len(tricky)), ")"}, lits: []string{tricky}},
		{lines: []string{`* 3 FETCH (ENVELOPE ("d" {5+}`, " NIL ~{2}", "))"}, lits: []string{"hello", "xy"}},
		{lines: []string{"* OK [ALERT] status text ending {3}"}},
		{lines: []string{"a1 OK done {4}"}},
	}
	ir := newScriptReader(in)
	for i, w := range want {
		r, err := ir.read(1 << 10)
		if err != nil {
			t.Fatalf("response %d: %v", i, err)
		}
		got := resp{}
		for _, l := range r.lines {
			got.lines = append(got.lines, string(l))
		}
		for _, l := range r.lits {
			got.lits = append(got.lits, string(l))
		}
		if fmt.Sprint(got) != fmt.Sprint(w) {
			t.Errorf("response %d: got %q, want %q", i, got, w)
		}
	}
	if _, err := ir.read(1 << 10); !errors.Is(err, io.EOF) {
		t.Errorf("after the last response: %v, want EOF", err)
	}

	for _, bad := range []struct{ in, why string }{
		{"* 1 FETCH (BODY[] {100}\r\nshort", "truncated literal"},
		{"* 1 FETCH (BODY[] {2000}\r\n" + strings.Repeat("x", 2000) + ")\r\n", "literal over the bound"},
		{"* 1 FETCH (BODY[] {99999999999}\r\n", "literal size over 32 bits"},
		{strings.Repeat("* 1 FETCH (BODY[] {0}\r\n", 3), "no end"},
		{"* " + strings.Repeat("x", 1100) + "\r\n", "line over the bound"},
	} {
		if _, err := newScriptReader(bad.in).read(1 << 10); err == nil {
			t.Errorf("%s: accepted", bad.why)
		}
	}
}

func TestIMAPCommandStatus(t *testing.T) {
	for _, tc := range []struct {
		script  string
		wantErr string // "" for success
		seen    int    // untagged responses handed over
	}{
		{"* 1 EXISTS\r\n* OK [UIDNEXT 5] x\r\na1 OK SELECT completed\r\n", "", 2},
		{"a1 ok lower case\r\n", "", 0},
		{"* BYE going\r\na1 NO [AUTHENTICATIONFAILED] wrong\r\n", `server said "a1 NO [AUTHENTICATIONFAILED] wrong"`, 1},
		{"a1 BAD syntax\r\n", `server said "a1 BAD syntax"`, 0},
		{"a2 OK someone else's\r\n", "unexpected response", 0},
		{"+ go ahead\r\n", "unexpected response", 0},
		{"a1 MAYBE\r\n", "bad tagged response", 0},
		{"* 1 EXISTS\r\n", "EOF", 1},
	} {
		sc := &scriptConn{in: strings.NewReader(tc.script)}
		c := newIMAPConn(newLineConn(t.Context(), sc, time.Second))
		seen := 0
		err := c.cmd("SELECT INBOX", 1<<10, func(*imapResponse) error { seen++; return nil })
		switch {
		case tc.wantErr == "" && err != nil, tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)):
			t.Errorf("%q: err %v, want %q", tc.script, err, tc.wantErr)
		case seen != tc.seen:
			t.Errorf("%q: %d untagged responses, want %d", tc.script, seen, tc.seen)
		case sc.out.String() != "a1 SELECT INBOX\r\n":
			t.Errorf("%q: sent %q", tc.script, sc.out.String())
		}
	}
}

// TestIMAPSession runs one session against a scripted server: the
// commands, the sets they name and what the result counts.
func TestIMAPSession(t *testing.T) {
	msg := func(id string) string {
		return "Received: from x\r\n\tby y\r\n" + IDHeader + ": " + id + "\r\nSubject: s\r\n\r\nbody\r\n"
	}
	m1, m2, m3 := msg("run.1"), msg("other.1"), msg("run.2")
	script := "* OK [CAPABILITY IMAP4rev1] ready\r\n" +
		"a1 OK [CAPABILITY IMAP4rev1] logged in\r\n" +
		"* 3 EXISTS\r\n* FLAGS (\\Seen \\Deleted)\r\na2 OK [READ-WRITE] selected\r\n" +
		"* 1 FETCH (FLAGS () ENVELOPE (NIL \"s\" NIL NIL NIL NIL NIL NIL NIL NIL))\r\n" +
		"* 2 FETCH (FLAGS (\\Seen) ENVELOPE (NIL {1}\r\ns NIL NIL NIL NIL NIL NIL NIL NIL))\r\n" +
		"a3 OK fetched\r\n" +
		fmt.Sprintf("* 1 FETCH (UID 4 BODY[] {%d}\r\n%s)\r\n", len(m1), m1) +
		"* 2 FETCH (FLAGS (\\Seen))\r\n" + // unsolicited: no body
		fmt.Sprintf("* 2 FETCH (BODY[] {%d}\r\n%s UID 6)\r\n", len(m2), m2) +
		fmt.Sprintf("* 3 FETCH (UID 5 BODY[] {%d}\r\n%s)\r\n", len(m3), m3) +
		"a4 OK fetched\r\n" +
		"a5 OK stored\r\n" +
		"* 3 EXPUNGE\r\n* 2 EXPUNGE\r\n* 1 EXPUNGE\r\na6 OK expunged\r\n" +
		"* BYE bye\r\na7 OK logged out\r\n"
	sc := &scriptConn{in: strings.NewReader(script)}
	cfg := &MixConfig{IMAPAddr: "imap.test:143", Password: `p"w\`, Dialer: sc, Timeout: time.Second}
	res := imapSession(t.Context(), cfg, "u@example.test", "run.", "run.2")
	if res.err != nil {
		t.Fatalf("session: %v\nsent:\n%s", res.err, sc.out.String())
	}
	wantSent := "a1 LOGIN \"u@example.test\" \"p\\\"w\\\\\"\r\n" +
		"a2 SELECT INBOX\r\n" +
		"a3 FETCH 1:3 (FLAGS ENVELOPE)\r\n" +
		"a4 FETCH 1:3 (UID BODY.PEEK[])\r\n" +
		"a5 UID STORE 4:6 +FLAGS.SILENT (\\Deleted)\r\n" +
		"a6 EXPUNGE\r\n" +
		"a7 LOGOUT\r\n"
	if got := sc.out.String(); got != wantSent {
		t.Errorf("sent:\n%s\nwant:\n%s", got, wantSent)
	}
	if res.msgs != 3 || res.bytes != int64(len(m1)+len(m2)+len(m3)) || res.runMsgs != 2 || !res.foundID || res.loginAt.IsZero() {
		t.Errorf("result %+v", res)
	}

	// An empty mailbox: no FETCH, no STORE; a failed EXPUNGE reports
	// nothing as retrieved.
	sc = &scriptConn{in: strings.NewReader("* OK hi\r\na1 OK in\r\n* 0 EXISTS\r\na2 OK sel\r\na3 OK bye\r\n")}
	cfg.Dialer = sc
	if res := imapSession(t.Context(), cfg, "u", "run.", ""); res.err != nil || res.msgs != 0 {
		t.Errorf("empty mailbox: %+v", res)
	}
	if !strings.HasSuffix(sc.out.String(), "a2 SELECT INBOX\r\na3 LOGOUT\r\n") {
		t.Errorf("empty mailbox sent %q", sc.out.String())
	}
	sc = &scriptConn{in: strings.NewReader("* OK hi\r\na1 OK in\r\n* 1 EXISTS\r\na2 OK sel\r\na3 OK\r\n" +
		fmt.Sprintf("* 1 FETCH (UID 1 BODY[] {%d}\r\n%s)\r\n", len(m1), m1) + "a4 OK\r\na5 OK\r\na6 NO [EXPUNGEISSUED] no\r\n")}
	cfg.Dialer = sc
	if res := imapSession(t.Context(), cfg, "u", "run.", ""); res.err == nil || res.msgs != 0 || res.runMsgs != 0 {
		t.Errorf("failed EXPUNGE: %+v", res)
	}
	sc = &scriptConn{in: strings.NewReader("* OK hi\r\na1 NO [AUTHENTICATIONFAILED] no\r\n")}
	cfg.Dialer = sc
	if res := imapSession(t.Context(), cfg, "u", "run.", ""); res.err == nil || !strings.Contains(res.err.Error(), "AUTHENTICATIONFAILED") {
		t.Errorf("failed LOGIN: %+v", res)
	}
}

func TestUIDSet(t *testing.T) {
	for _, tc := range []struct {
		in   []uint32
		want string
	}{
		{[]uint32{1}, "1"},
		{[]uint32{3, 4, 5, 9}, "3:5,9"},
		{[]uint32{9, 1, 2, 2, 7, 8}, "1:2,7:9"},
	} {
		if got := uidSet(tc.in); got != tc.want {
			t.Errorf("uidSet(%v) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

// FuzzIMAPResponse feeds arbitrary server output to the response reader:
// it must not panic, every response must respect the bound, and every
// literal must be what its announcement said.
func FuzzIMAPResponse(f *testing.F) {
	f.Add([]byte("* 1 FETCH (UID 7 BODY[] {5}\r\nhello)\r\na1 OK done\r\n"), 100)
	f.Add([]byte("* 1 FETCH (BODY[] {0}\r\n)\r\n* 2 FETCH (X {3+}\r\na\r\n ~{1}\r\nz)\r\n"), 64)
	f.Add([]byte("* OK text {3}\r\n+ go\r\na1 BAD {2}\r\n"), 10)
	f.Add([]byte("* 1 FETCH (BODY[] {4294967296}\r\n"), 1<<20)
	f.Add([]byte("* 3 EXISTS\n* 1 FETCH {2}\nab\n"), 8)
	f.Fuzz(func(t *testing.T, in []byte, max int) {
		max &= 0xffff
		ir := newScriptReader(string(in))
		for {
			r, err := ir.read(max)
			if err != nil {
				return
			}
			if len(r.lines) != len(r.lits)+1 {
				t.Fatalf("%d lines and %d literals", len(r.lines), len(r.lits))
			}
			total := 0
			for _, l := range r.lines {
				total += len(l)
			}
			for i, l := range r.lits {
				n, ok, err := literalSize(r.lines[i])
				if !ok || err != nil || n != len(l) {
					t.Fatalf("literal %d: %d octets after %q", i, len(l), r.lines[i])
				}
				total += len(l)
			}
			if total > max {
				t.Fatalf("response of %d octets over the %d bound", total, max)
			}
			if _, _, _, err := fetchedBody(r); err != nil && !errors.Is(err, ErrProtocol) {
				t.Fatalf("fetchedBody: unclassified error %v", err)
			}
			parseExists(r.lines[0])
		}
	})
}

// failDialer fails the test if a session is started.
type failDialer struct{ t *testing.T }

func (d failDialer) DialContext(context.Context, string, string) (net.Conn, error) {
	d.t.Error("a session was started for a busy user")
	return nil, errors.New("no")
}

func TestRetrieveIMAPSkipsBusyUser(t *testing.T) {
	cfg := &MixConfig{Retrieval: RetrievalIMAP, IMAPAddr: "imap.test:143", Dialer: failDialer{t}, Timeout: time.Second}
	r := &mixRun{cfg: cfg, ctx: t.Context(), idPfx: "run."}
	r.busy.users = map[string]struct{}{"u@example.test": {}}
	res := r.retrieve("U@Example.Test", "")
	if !errors.Is(res.err, errInUse) {
		t.Fatalf("busy user: %v, want errInUse", res.err)
	}
	var st pop3Stats
	st.add(res, time.Millisecond)
	if st.sessions != 1 || st.inUse != 1 || st.failed != 0 {
		t.Errorf("counted as %+v, want one in-use session", st)
	}

	// A free user gets a session, and is free again after it.
	sc := &scriptConn{in: strings.NewReader("* OK hi\r\na1 OK in\r\n* 0 EXISTS\r\na2 OK sel\r\na3 OK bye\r\n")}
	cfg.Dialer = sc
	if res := r.retrieve("v@example.test", ""); res.err != nil {
		t.Fatalf("free user: %v", res.err)
	}
	if _, busy := r.busy.users["v@example.test"]; busy || len(r.busy.users) != 1 {
		t.Errorf("in-flight set after the session: %v", r.busy.users)
	}
}
