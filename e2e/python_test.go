package e2e

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// runPython runs testdata/SCRIPT with args and decodes its one JSON line
// into out. The script exits 0 whenever it could talk to the server; a
// non-zero exit (a traceback) fails the test.
func runPython(t *testing.T, script string, out any, args ...string) {
	t.Helper()
	py := requireTool(t, "python3")
	cmd := exec.Command(py, append([]string{filepath.Join("testdata", script)}, args...)...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("python3 %s %s: %v\nstdout: %s\nstderr: %s", script, strings.Join(args, " "), err, stdout.Bytes(), stderr.Bytes())
	}
	if err := json.Unmarshal(stdout.Bytes(), out); err != nil {
		t.Fatalf("python3 %s: output %q: %v\nstderr: %s", script, stdout.Bytes(), err, stderr.Bytes())
	}
	t.Logf("python3 %s %s -> %s", script, strings.Join(redact(args), " "), bytes.TrimSpace(stdout.Bytes()))
}

// redact hides the value after --password in logged command lines.
func redact(args []string) []string {
	out := slices.Clone(args)
	for i := range out {
		if i > 0 && out[i-1] == "--password" {
			out[i] = "REDACTED"
		}
	}
	return out
}

func port(t *testing.T, addr string) string {
	t.Helper()
	_, p, err := net.SplitHostPort(addr)
	if err != nil {
		t.Fatalf("listener address %q: %v", addr, err)
	}
	return p
}

// writeMessage stores msg in a temp file for a client to send.
func writeMessage(t *testing.T, msg []byte) string {
	t.Helper()
	f := filepath.Join(t.TempDir(), "message.eml")
	if err := os.WriteFile(f, msg, 0o600); err != nil {
		t.Fatal(err)
	}
	return f
}

type smtpResult struct {
	Replies            [][3]any          `json:"replies"` // command, code, text
	Data               [2]any            `json:"data"`
	Quit               int               `json:"quit"`
	Extensions         []string          `json:"extensions"`
	ExtensionsBeforeTL []string          `json:"extensions_before_tls"`
	StartTLS           int               `json:"starttls"`
	TLSVersion         string            `json:"tls_version"`
	AuthMechanisms     []string          `json:"auth_mechanisms"`
	Auth               [2]any            `json:"auth"` // code, text
	Sent               bool              `json:"sent"`
	Refused            map[string][2]any `json:"refused"`
	Error              any               `json:"error"`
}

func code(v any) int {
	f, _ := v.(float64)
	return int(f)
}

type popMessage struct {
	ListOne string `json:"list_one"`
	UIDLOne string `json:"uidl_one"`
	Top0    string `json:"top0"`
	Top2    string `json:"top2"`
	Retr    string `json:"retr"`
}

type popResult struct {
	Err            string       `json:"err"`
	Capa           []string     `json:"capa"`
	STLS           string       `json:"stls"`
	TLSVersion     string       `json:"tls_version"`
	CapaAfterSTLS  []string     `json:"capa_after_stls"`
	Login          string       `json:"login"`
	Stat           [2]int64     `json:"stat"`
	List           [][]string   `json:"list"`
	UIDL           [][]string   `json:"uidl"`
	Messages       []popMessage `json:"messages"`
	RetrPastEnd    string       `json:"retr_past_end"`
	StatBefore     [2]int64     `json:"stat_before"`
	StatAfterDele  [2]int64     `json:"stat_after_dele"`
	RetrDeleted    string       `json:"retr_deleted"`
	StatAfterRSET  [2]int64     `json:"stat_after_rset"`
	FirstLogin     string       `json:"first_login"`
	SecondLogin    string       `json:"second_login"`
	SecondLoginErr string       `json:"second_login_err"`
	ThirdLogin     string       `json:"third_login"`
}

func b64(t *testing.T, s string) []byte {
	t.Helper()
	b, err := base64.StdEncoding.DecodeString(s)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestPythonSubmitAndRetrieve sends with smtplib over every SMTP path a
// client uses (MX with pipelining, submission with STARTTLS and each SASL
// mechanism, implicit TLS) and reads the result back with poplib, checking
// the bytes and the POP3 maildrop semantics of RFC 1939.
func TestPythonSubmitAndRetrieve(t *testing.T) {
	s := startServer(t, Options{})
	const alice, alicePW = "alice@example.test", "alice correct horse 1"
	const bob, bobPW = "bob@example.test", "bob-battery-staple-2"
	addUser(t, s, alice, alicePW)
	addUser(t, s, bob, bobPW)
	smtpPort, subPort, subsPort, popPort := port(t, s.Addr("smtp")), port(t, s.Addr("submission")), port(t, s.Addr("submissions")), port(t, s.Addr("pop3"))

	sent := map[string][]byte{} // token -> message, everything bob must get

	// MX: one pipelined MAIL/RCPT/RCPT/DATA group (RFC 2920) for two users.
	tok := token()
	pipelinedTok := tok
	msg := testMessage("sender@remote.example", bob, "pipelined", tok)
	sent[tok] = msg
	var r smtpResult
	runPython(t, "smtp_client.py", &r, "pipelined", "--port", smtpPort,
		"--from", "sender@remote.example", "--to", alice, "--to", bob, "--message", writeMessage(t, msg))
	if r.Error != nil {
		t.Fatalf("pipelined: %v", r.Error)
	}
	wantCodes := []int{250, 250, 250, 354}
	if len(r.Replies) != len(wantCodes) {
		t.Fatalf("pipelined: %d replies, want %d: %v", len(r.Replies), len(wantCodes), r.Replies)
	}
	for i, rep := range r.Replies {
		if code(rep[1]) != wantCodes[i] {
			t.Errorf("pipelined %v: got %v %v, want %d", rep[0], rep[1], rep[2], wantCodes[i])
		}
	}
	if code(r.Data[0]) != 250 || r.Quit != 221 {
		t.Errorf("pipelined: end of data %v, QUIT %d; want 250, 221", r.Data, r.Quit)
	}

	// Submission: STARTTLS, then each SASL mechanism smtplib offers.
	for _, mech := range []string{"PLAIN", "LOGIN", "LOGIN-NOIR"} {
		tok := token()
		msg := testMessage(alice, bob, "submission "+mech, tok)
		sent[tok] = msg
		var r smtpResult
		runPython(t, "smtp_client.py", &r, "starttls", "--port", subPort, "--mech", mech,
			"--user", alice, "--password", alicePW, "--from", alice, "--to", bob, "--message", writeMessage(t, msg))
		if !slices.Contains(r.ExtensionsBeforeTL, "starttls") {
			t.Errorf("%s: STARTTLS not advertised before TLS: %v", mech, r.ExtensionsBeforeTL)
		}
		if slices.Contains(r.Extensions, "starttls") {
			t.Errorf("%s: STARTTLS still advertised after TLS (RFC 3207 section 4.2)", mech)
		}
		if r.StartTLS != 220 {
			t.Errorf("%s: STARTTLS reply %d, want 220", mech, r.StartTLS)
		}
		for _, m := range []string{"PLAIN", "LOGIN"} {
			if !slices.Contains(r.AuthMechanisms, m) {
				t.Errorf("%s: AUTH %s not advertised after STARTTLS: %v", mech, m, r.AuthMechanisms)
			}
		}
		if code(r.Auth[0]) != 235 || !r.Sent || len(r.Refused) != 0 || r.Error != nil {
			t.Fatalf("%s: auth %v, sent %v, refused %v, error %v", mech, r.Auth, r.Sent, r.Refused, r.Error)
		}
	}

	// Submissions: implicit TLS (RFC 8314).
	tok = token()
	msg = testMessage(alice, bob, "implicit TLS", tok)
	sent[tok] = msg
	r = smtpResult{}
	runPython(t, "smtp_client.py", &r, "implicit", "--port", subsPort,
		"--user", alice, "--password", alicePW, "--from", alice, "--to", bob, "--message", writeMessage(t, msg))
	if r.TLSVersion == "" || code(r.Auth[0]) != 235 || !r.Sent || r.Error != nil {
		t.Fatalf("implicit TLS: tls %q, auth %v, sent %v, error %v", r.TLSVersion, r.Auth, r.Sent, r.Error)
	}

	// A wrong password: 535 5.7.8 (RFC 4954 section 6).
	r = smtpResult{}
	runPython(t, "smtp_client.py", &r, "badpass", "--port", subPort, "--user", alice, "--password", "not-"+alicePW)
	if code(r.Auth[0]) != 535 || !strings.HasPrefix(fmt.Sprint(r.Auth[1]), "5.7.8") {
		t.Errorf("bad password: AUTH reply %v, want 535 5.7.8", r.Auth)
	}

	// POP3 over STLS: every message, byte for byte, and consistent views.
	var p popResult
	runPython(t, "pop3_client.py", &p, "inspect", "--port", popPort, "--user", bob, "--password", bobPW, "--stls")
	if p.Err != "" {
		t.Fatalf("POP3 STLS inspect: %s", p.Err)
	}
	for _, c := range []string{"STLS", "USER", "UIDL", "TOP", "RESP-CODES"} {
		if !slices.Contains(p.Capa, c) {
			t.Errorf("CAPA before STLS lacks %s: %v", c, p.Capa)
		}
	}
	if slices.Contains(p.CapaAfterSTLS, "STLS") {
		t.Errorf("CAPA after STLS still offers STLS: %v", p.CapaAfterSTLS)
	}
	if !strings.HasPrefix(p.STLS, "+OK") || p.TLSVersion == "" {
		t.Errorf("STLS: %q, TLS version %q", p.STLS, p.TLSVersion)
	}
	stlsUIDs := checkMaildrop(t, p, sent)

	// The same maildrop in the clear (loopback): the same UIDs and bytes.
	p = popResult{}
	runPython(t, "pop3_client.py", &p, "inspect", "--port", popPort, "--user", bob, "--password", bobPW)
	if p.Err != "" {
		t.Fatalf("POP3 plain inspect: %s", p.Err)
	}
	if plainUIDs := checkMaildrop(t, p, sent); !slices.Equal(plainUIDs, stlsUIDs) {
		t.Errorf("UIDL changed between sessions (RFC 1939 section 7): %v then %v", stlsUIDs, plainUIDs)
	}

	// Alice got the pipelined message only.
	aliceMsgs := mustFetchAll(t, s.Addr("pop3"), alice, alicePW)
	if len(aliceMsgs) != 1 || len(findToken(aliceMsgs, pipelinedTok)) != 1 {
		t.Errorf("alice has %d messages, want exactly the pipelined one", len(aliceMsgs))
	}

	// DELE is undone by RSET and by a dropped connection; QUIT commits it.
	for _, finish := range []string{"rset", "drop"} {
		var d popResult
		runPython(t, "pop3_client.py", &d, "delete", "--port", popPort, "--user", bob, "--password", bobPW, "--msg", "1", "--finish", finish)
		if d.Err != "" {
			t.Fatalf("DELE then %s: %s", finish, d.Err)
		}
		if d.StatAfterDele[0] != d.StatBefore[0]-1 || !strings.HasPrefix(d.RetrDeleted, "-ERR") {
			t.Errorf("DELE then %s: STAT %v -> %v, RETR of deleted %q", finish, d.StatBefore, d.StatAfterDele, d.RetrDeleted)
		}
		if finish == "rset" && d.StatAfterRSET != d.StatBefore {
			t.Errorf("RSET: STAT %v, want %v", d.StatAfterRSET, d.StatBefore)
		}
		if n := len(mustFetchAll(t, s.Addr("pop3"), bob, bobPW)); n != len(sent) {
			t.Errorf("after DELE then %s: %d messages, want %d", finish, n, len(sent))
		}
	}
	var d popResult
	runPython(t, "pop3_client.py", &d, "delete", "--port", popPort, "--user", bob, "--password", bobPW, "--msg", "1", "--msg", "2", "--finish", "quit")
	if d.Err != "" {
		t.Fatalf("DELE then QUIT: %s", d.Err)
	}
	p = popResult{}
	runPython(t, "pop3_client.py", &p, "inspect", "--port", popPort, "--user", bob, "--password", bobPW)
	if p.Err != "" {
		t.Fatalf("POP3 inspect after QUIT: %s", p.Err)
	}
	var left []string
	for _, u := range p.UIDL {
		left = append(left, u[1])
	}
	if !slices.Equal(left, stlsUIDs[2:]) {
		t.Errorf("after DELE 1, DELE 2, QUIT: UIDs %v, want %v", left, stlsUIDs[2:])
	}

	// A second concurrent session is refused with [IN-USE] (RFC 2449
	// section 8.1.2) and the lock goes with the first session's QUIT.
	var u popResult
	runPython(t, "pop3_client.py", &u, "inuse", "--port", popPort, "--user", bob, "--password", bobPW)
	if u.Err != "" {
		t.Fatalf("inuse: %s", u.Err)
	}
	if !strings.HasPrefix(u.FirstLogin, "+OK") {
		t.Errorf("first login: %q", u.FirstLogin)
	}
	if !strings.HasPrefix(u.SecondLoginErr, "-ERR [IN-USE]") {
		t.Errorf("second concurrent login: got %q (ok %q), want -ERR [IN-USE]", u.SecondLoginErr, u.SecondLogin)
	}
	if !strings.HasPrefix(u.ThirdLogin, "+OK") {
		t.Errorf("login after the first session quit: %q", u.ThirdLogin)
	}
}

// checkMaildrop checks one poplib inspection of a maildrop holding exactly
// the messages in sent, and returns its UIDs in message order.
func checkMaildrop(t *testing.T, p popResult, sent map[string][]byte) []string {
	t.Helper()
	if int(p.Stat[0]) != len(sent) || len(p.Messages) != len(sent) || len(p.List) != len(sent) || len(p.UIDL) != len(sent) {
		t.Fatalf("STAT %v, %d messages, LIST %v, UIDL %v; want %d messages", p.Stat, len(p.Messages), p.List, p.UIDL, len(sent))
	}
	var total int64
	var uids []string
	seen := map[string]bool{}
	for i, m := range p.Messages {
		retr := b64(t, m.Retr)
		var size int64
		if len(p.List[i]) != 2 || p.List[i][0] != strconv.Itoa(i+1) {
			t.Errorf("LIST line %d: %v", i+1, p.List[i])
		} else if _, err := fmt.Sscan(p.List[i][1], &size); err != nil {
			t.Errorf("LIST line %d: %v", i+1, p.List[i])
		}
		// RFC 1939 section 5: the size is the exact octet count as
		// retrieved (CRLF line ends, before byte-stuffing).
		if size != int64(len(retr)) {
			t.Errorf("message %d: LIST size %d, RETR has %d octets", i+1, size, len(retr))
		}
		if m.ListOne != "+OK "+strconv.Itoa(i+1)+" "+p.List[i][1] {
			t.Errorf("LIST %d: %q, want it to agree with %v", i+1, m.ListOne, p.List[i])
		}
		total += size
		uid := p.UIDL[i][1]
		if len(p.UIDL[i]) != 2 || p.UIDL[i][0] != strconv.Itoa(i+1) || !validUID(uid) || seen[uid] {
			t.Errorf("UIDL line %d: %v (UIDs must be unique, 1-70 chars 0x21-0x7E)", i+1, p.UIDL[i])
		}
		seen[uid] = true
		uids = append(uids, uid)
		if m.UIDLOne != "+OK "+strconv.Itoa(i+1)+" "+uid {
			t.Errorf("UIDL %d: %q, want it to agree with %v", i+1, m.UIDLOne, p.UIDL[i])
		}
		var want []byte
		for tok, msg := range sent {
			if bytes.Contains(retr, []byte("token "+tok+"\r\n")) {
				want = msg
			}
		}
		if want == nil {
			t.Errorf("message %d is none of those sent:\n%s", i+1, retr)
			continue
		}
		if err := checkDelivered(retr, want); err != nil {
			t.Errorf("message %d: %v", i+1, err)
		}
		// TOP n 0 is the header section and the blank line; TOP n 2 adds
		// the first two body lines (RFC 1939 section 7).
		head, body, ok := bytes.Cut(retr, []byte("\r\n\r\n"))
		if !ok {
			t.Errorf("message %d has no header/body separator", i+1)
			continue
		}
		if top0 := b64(t, m.Top0); !bytes.Equal(top0, append(head, "\r\n\r\n"...)) {
			t.Errorf("TOP %d 0:\n%q\nwant\n%q", i+1, top0, append(head, "\r\n\r\n"...))
		}
		bodyLines := bytes.SplitAfter(body, []byte("\r\n"))
		want2 := append(append(head, "\r\n\r\n"...), bytes.Join(bodyLines[:2], nil)...)
		if top2 := b64(t, m.Top2); !bytes.Equal(top2, want2) {
			t.Errorf("TOP %d 2:\n%q\nwant\n%q", i+1, top2, want2)
		}
	}
	if total != p.Stat[1] {
		t.Errorf("STAT size %d, LIST sizes add up to %d", p.Stat[1], total)
	}
	if !strings.HasPrefix(p.RetrPastEnd, "-ERR") {
		t.Errorf("RETR past the last message: %q, want -ERR", p.RetrPastEnd)
	}
	return uids
}

// validUID: RFC 1939 section 7, 1 to 70 characters in 0x21..0x7E.
func validUID(s string) bool {
	if len(s) < 1 || len(s) > 70 {
		return false
	}
	for i := 0; i < len(s); i++ {
		if s[i] < 0x21 || s[i] > 0x7e {
			return false
		}
	}
	return true
}
