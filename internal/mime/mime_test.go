package mime

import (
	"bytes"
	"errors"
	"fmt"
	"net/mail"
	"strings"
	"testing"
	"time"
)

func TestAddressList(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"", "NIL"},
		{"a@b", `((NIL NIL "a" "b"))`},
		{`"Joe Q. Public" <john.q.public@example.com>`, `(("Joe Q. Public" NIL "john.q.public" "example.com"))`},
		{`Joe Q. Public <john.q.public@example.com>`, `(("Joe Q. Public" NIL "john.q.public" "example.com"))`},
		{"Mary Smith <mary@x.test>, jdoe@example.org, Who? <one@y.test>", `(("Mary Smith" NIL "mary" "x.test")(NIL NIL "jdoe" "example.org")("Who?" NIL "one" "y.test"))`},
		{`<boss@nil.test>, "Giant; \"Big\" Box" <sysservices@example.net>`, `((NIL NIL "boss" "nil.test")("Giant; \"Big\" Box" NIL "sysservices" "example.net"))`},
		{"Pete(A nice \\) chap) <pete(his account)@silly.test(his host)>", `(("Pete" NIL "pete" "silly.test"))`},
		{"A Group(Some people)\r\n     :Chris Jones <c@(Chris's host.)public.example>,\r\n         joe@example.org;", `((NIL NIL "A Group" NIL)("Chris Jones" NIL "c" "public.example")(NIL NIL "joe" "example.org")(NIL NIL NIL NIL))`},
		{"Undisclosed recipients:;", `((NIL NIL "Undisclosed recipients" NIL)(NIL NIL NIL NIL))`},
		{"john . doe @ example . org", `((NIL NIL "john.doe" "example.org"))`},
		{`"quoted local"@example.org`, `((NIL NIL "\"quoted local\"" "example.org"))`},
		{"user@[192.0.2.1]", `((NIL NIL "user" "[192.0.2.1]"))`},
		{"root", `((NIL NIL "root" "MISSING_DOMAIN"))`},
		{"<@a.test,@b.test:x@c.test>", `((NIL "@a.test,@b.test" "x" "c.test"))`},
		{"<>", "NIL"},
		{"Name <>", `(("Name" NIL "MISSING_MAILBOX" "MISSING_DOMAIN"))`},
		{",,a@b,,", `((NIL NIL "a" "b"))`},
		{"bad>>x@y, ok@z", `((NIL NIL "bad" "MISSING_DOMAIN")(NIL NIL "ok" "z"))`},
		{`"unterminated <a@b>`, `((NIL NIL "\"unterminated <a@b>" "MISSING_DOMAIN"))`},
		{"=?utf-8?q?J=C3=B6rg?= <j@x>", `(("=?utf-8?q?J=C3=B6rg?=" NIL "j" "x"))`},
		{"a@b (First  Last)", `(("First Last" NIL "a" "b"))`},
	} {
		got := string(appendAddresses(nil, parseAddressList([]byte(tc.in))))
		if got != tc.want {
			t.Errorf("%q:\n got %s\nwant %s", tc.in, got, tc.want)
		}
	}
}

func TestBaseSubject(t *testing.T) {
	for _, tc := range []struct {
		in, base string
		replyFwd bool
	}{
		{"", "", false},
		{"Hello", "Hello", false},
		{"Re: Hello", "Hello", true},
		{"RE: re: Fwd: Hello", "Hello", true},
		{"Re[2]: Hello", "Hello", true},
		{"[list] Re: Hello", "Hello", true},
		{"[list] Hello", "Hello", false},
		{"[list]", "[list]", false},
		{"Hello (fwd)", "Hello", true},
		{"[Fwd: Re: Hello]", "Hello", true},
		{"  spaced \t  out  ", "spaced out", false},
		{"=?utf-8?q?Re=3A_caf=C3=A9?=", "café", true},
		{"Re:", "", true},
		{"Reply: not a prefix", "Reply: not a prefix", false},
	} {
		base, rf := BaseSubject(tc.in)
		if base != tc.base || rf != tc.replyFwd {
			t.Errorf("BaseSubject(%q) = %q, %v; want %q, %v", tc.in, base, rf, tc.base, tc.replyFwd)
		}
	}
}

// dateCases are Date field values and whether parseDateFast takes them;
// FuzzParseDate is seeded with them.
var dateCases = []struct {
	in   string
	fast bool
}{
	{"Mon, 02 Jan 2006 15:04:05 -0700", true},
	{"02 Jan 2006 15:04:05 -0700", true},
	{"Tue, 1 Jul 2025 09:00:00 +0200", true},
	{"Sun, 9 Mar 2025 08:30 +0000", true},
	{"Fri, 21 Nov 1997 09:55:06 -0600 (MDT)", true},
	{"Thu, 13 Feb 1969 23:32:54 -0330 (Newfoundland Time)", true},
	{"Mon, 02 Jan 2006 15:04:05 +0530 ()", true},
	{"Thu, 29 Feb 2024 12:00:00 +0000 (UTC)", true},
	{"Sat, 31 Dec 2022 23:59:59 +1400", true},
	{"Sat, 31 Dec 2022 23:59:59 -1200", true},
	{"Wed, 1 Jan 2025 00:00:00 +0545", true},
	{"1 Jan 0000 00:00 +2359", true},
	{"31 Dec 9999 23:59:59 -2359", true},
	{"Tue, 15 Nov 1994 08:12:31 +0007", true},
	{"Mon, 02 Jan 2006 15:04:05 -0700 (a\tb \xe2\x9c\x93)", true},

	{"Thu, 31 Apr 2025 10:00:00 +0000", false},
	{"Wed, 29 Feb 2023 10:00:00 +0000", false},
	{"Tue, 29 Feb 2100 10:00:00 +0000", false},
	{"Tue, 29 Feb 2000 10:00:00 +0000", true},
	{"Mon, 00 Jan 2024 10:00:00 +0000", false},
	{"Mon, 32 Jan 2024 10:00:00 +0000", false},
	{"Mon, 1 Jan 2024 24:00:00 +0000", false},
	{"Mon, 1 Jan 2024 12:60:00 +0000", false},
	{"Mon, 1 Jan 2024 12:00:60 +0000", false},
	{"mon, 1 Jan 2024 12:00:00 +0000", false},
	{"Mon, 1 jan 2024 12:00:00 +0000", false},
	{"Mon, 1 Jan 2024 12:00:00 GMT", false},
	{"Mon, 1 Jan 2024 12:00:00 EST", false},
	{"Mon, 1 Jan 2024 12:00:00 UT", false},
	{"Mon, 1 Jan 24 12:00:00 +0000", false},
	{"Mon, 1 Jan 2024 12:00:00 +0000 ", false},
	{" Mon, 1 Jan 2024 12:00:00 +0000", false},
	{"Mon,  1 Jan 2024 12:00:00 +0000", false},
	{"Mon, 1 Jan 2024 12:00:00\r\n +0000", false},
	{"Mon, 1 Jan 2024 12:00:00 +0000 (a (nested) comment)", false},
	{"Mon, 1 Jan 2024 12:00:00 +0000 (a \\) quoted-pair)", false},
	{"Mon, 1 Jan 2024 12:00:00 +0000 (UTC) trailing", false},
	{"Mon, 1 Jan 2024 12:00:00 +0000 (CR\rLF)", false},
	{"Mon, 1 Jan 2024 12:00:00 +0000 (CR\r\nLF)", false},
	{"Mon, 1 Jan 2024 9:00:00 +0000", false},
	{"Mon, 1 Jan 2024 12:00:00.5 +0000", false},
	{"Mon, 1 Jan 2024 12:00:00 +2400", false},
	{"Mon, 1 Jan 2024 12:00:00 +0060", false},
	{"Mon, 1 Jan 2024 12:00:00 +2460", false},
	{"Mon, 1 Jan 2024 12:00:00 +2500", false},
	{"Mon, 1 Jan 2024 12:00:00 +00", false},
	{"Mon, 1 Jan 2024 12:00:00 -07:00", false},
	{"Xyz, 1 Jan 2024 12:00:00 +0000", false},
	{"Monday, 1 Jan 2024 12:00:00 +0000", false},
	{"Mon, 001 Jan 2024 12:00:00 +0000", false},
	{"Mon, 1 Jan 20240 12:00:00 +0000", false},
	{"2024-01-01T12:00:00Z", false},
	{"", false},
}

// TestParseDate: parseDate agrees with mail.ParseDate on success, Unix time
// and zone offset, and the fast path takes the forms it is meant to.
func TestParseDate(t *testing.T) {
	for _, tc := range dateCases {
		if _, ok := parseDateFast(tc.in); ok != tc.fast {
			t.Errorf("parseDateFast(%q) ok = %v, want %v", tc.in, ok, tc.fast)
		}
		checkParseDate(t, tc.in)
	}
}

// checkParseDate compares parseDate(s) and parseDateFast(s) with
// mail.ParseDate(s).
func checkParseDate(t *testing.T, s string) {
	t.Helper()
	want, err := mail.ParseDate(s)
	got, ok := parseDate(s)
	if ok != (err == nil) {
		t.Fatalf("parseDate(%q) ok = %v; mail.ParseDate error %v", s, ok, err)
	}
	fast, fastOK := parseDateFast(s)
	if fastOK && err != nil {
		t.Fatalf("parseDateFast(%q) = %v; mail.ParseDate error %v", s, fast, err)
	}
	if !ok {
		return
	}
	_, wantOff := want.Zone()
	for _, r := range []struct {
		name string
		t    time.Time
		ok   bool
	}{{"parseDate", got, true}, {"parseDateFast", fast, fastOK}} {
		if !r.ok {
			continue
		}
		if _, off := r.t.Zone(); r.t.Unix() != want.Unix() || off != wantOff {
			t.Fatalf("%s(%q) = %v (Unix %d, offset %d); mail.ParseDate: %v (Unix %d, offset %d)",
				r.name, s, r.t, r.t.Unix(), off, want, want.Unix(), wantOff)
		}
	}
}

func TestAppendString(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"", `""`},
		{"plain", `"plain"`},
		{`a "b" \c`, `"a \"b\" \\c"`},
		{"line\r\nbreak", "{11}\r\nline\r\nbreak"},
		{"Grüße", "{7}\r\nGrüße"},
		{strings.Repeat("x", maxQuoted+1), fmt.Sprintf("{%d}\r\n%s", maxQuoted+1, strings.Repeat("x", maxQuoted+1))},
	} {
		if got := string(appendString(nil, tc.in)); got != tc.want {
			t.Errorf("appendString(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
	if got := string(appendNString(nil, "")); got != "NIL" {
		t.Errorf(`appendNString("") = %s`, got)
	}
}

// TestLimits checks that absurd structures degrade instead of growing the
// summary without bound.
func TestLimits(t *testing.T) {
	t.Run("depth", func(t *testing.T) {
		var b strings.Builder
		for i := range MaxDepth + 10 {
			fmt.Fprintf(&b, "Content-Type: multipart/mixed; boundary=b%d\r\n\r\n--b%d\r\n", i, i)
		}
		b.WriteString("Content-Type: text/plain\r\n\r\ndeep\r\n")
		msg := []byte(b.String())
		s, _ := Parse(bytes.NewReader(msg))
		checkSummary(t, msg, s)
		if s.Anomalies&AnomalyDepth == 0 {
			t.Errorf("anomalies %v, want depth", s.Anomalies)
		}
		depth := 0
		for p := s.Root; p.IsMultipart() && len(p.Children) > 0; p = p.Children[0] {
			depth++
		}
		if depth != MaxDepth {
			t.Errorf("nested %d multiparts, want %d", depth, MaxDepth)
		}
	})
	t.Run("rfc822 depth", func(t *testing.T) {
		msg := []byte(strings.Repeat("Subject: x\r\nContent-Type: message/rfc822\r\n\r\n", MaxDepth+10) + "body\r\n")
		s, _ := Parse(bytes.NewReader(msg))
		checkSummary(t, msg, s)
		if s.Anomalies&AnomalyDepth == 0 {
			t.Errorf("anomalies %v, want depth", s.Anomalies)
		}
	})
	t.Run("parts", func(t *testing.T) {
		msg := []byte("Content-Type: multipart/mixed; boundary=x\r\n\r\n" + strings.Repeat("--x\r\n\r\np\r\n", MaxParts+50) + "--x--\r\n")
		s, _ := Parse(bytes.NewReader(msg))
		checkSummary(t, msg, s)
		if len(s.Root.Children) != MaxParts || s.Anomalies&AnomalyParts == 0 {
			t.Errorf("%d parts, anomalies %v; want %d, parts", len(s.Root.Children), s.Anomalies, MaxParts)
		}
		last := s.Root.Children[MaxParts-1]
		if last.End != int64(len(msg))-int64(len("\r\n--x--\r\n")) {
			t.Errorf("the last part ends at %d, not at the close delimiter", last.End)
		}
	})
	t.Run("long lines", func(t *testing.T) {
		long := strings.Repeat("y", 3*maxLineKeep)
		msg := []byte("Subject: " + long + "\r\nX-Long: " + long + "\r\n\r\n" + long + "\r\n")
		s, _ := Parse(bytes.NewReader(msg))
		checkSummary(t, msg, s)
		if n := len(s.Envelope.Subject); n > MaxFieldLen || n < MaxFieldLen-16 || s.Anomalies&AnomalyHeader == 0 || s.Root.Lines != 1 {
			t.Errorf("subject %d octets, anomalies %v, lines %d", len(s.Envelope.Subject), s.Anomalies, s.Root.Lines)
		}
	})
}

func TestPart(t *testing.T) {
	msg := "Content-Type: message/rfc822\r\n\r\nSubject: inner\r\n\r\ninner body\r\n"
	s, _ := Parse(strings.NewReader(msg))
	for _, tc := range []struct {
		path      []int
		ok        bool
		body      string
		isMessage bool
	}{
		{nil, true, msg, true},
		{[]int{1}, true, "Subject: inner\r\n\r\ninner body\r\n", true},
		{[]int{1, 1}, true, "inner body\r\n", false},
		{[]int{1, 1, 1}, false, "", false},
		{[]int{2}, false, "", false},
		{[]int{0}, false, "", false},
	} {
		pi, ok := s.Part(tc.path)
		if ok != tc.ok || (ok && (msg[pi.Body.Start:pi.Body.End] != tc.body || pi.IsMessage != tc.isMessage)) {
			t.Errorf("Part(%v) = %+v, %v", tc.path, pi, ok)
		}
	}
	if pi, _ := s.Part([]int{1}); msg[pi.Header.Start:pi.Header.End] != "Subject: inner\r\n\r\n" || msg[pi.Text.Start:pi.Text.End] != "inner body\r\n" {
		t.Errorf("BODY[1.HEADER] and BODY[1.TEXT] are %+v, %+v", pi.Header, pi.Text)
	}
}

func TestUnmarshalRejects(t *testing.T) {
	s, _ := Parse(strings.NewReader("Content-Type: multipart/mixed; boundary=x\r\n\r\n--x\r\n\r\na\r\n--x--\r\n"))
	enc, err := s.MarshalBinary()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Unmarshal(append([]byte{9}, enc[1:]...)); !errors.Is(err, ErrVersion) {
		t.Errorf("unknown version: %v", err)
	}
	for i := range len(enc) {
		if _, err := Unmarshal(enc[:i]); !errors.Is(err, ErrCorrupt) {
			t.Errorf("truncated to %d octets: %v", i, err)
		}
	}
	if _, err := Unmarshal(append(enc, 0)); !errors.Is(err, ErrCorrupt) {
		t.Errorf("trailing octet: %v", err)
	}
}

// TestEncodedSize holds the encoding to its budget: a typical 5 KB text
// message well under 1 KB.
func TestEncodedSize(t *testing.T) {
	s, _ := Parse(bytes.NewReader(textMessage(5 << 10)))
	enc, _ := s.MarshalBinary()
	if len(enc) > 512 {
		t.Errorf("a 5 KB text message encodes in %d octets", len(enc))
	}
}

func textMessage(size int) []byte {
	var b bytes.Buffer
	b.WriteString("Return-Path: <alice@example.org>\r\nReceived: from mx.example.org by mx.example.net; Tue, 1 Jul 2025 09:00:00 +0200\r\n" +
		"Date: Tue, 1 Jul 2025 09:00:00 +0200\r\nFrom: Alice Example <alice@example.org>\r\nTo: Bob Example <bob@example.net>\r\n" +
		"Cc: carol@example.net\r\nSubject: Re: quarterly numbers\r\nMessage-ID: <20250701090000.1234@example.org>\r\n" +
		"In-Reply-To: <20250630.5678@example.net>\r\nReferences: <20250629.1@example.net> <20250630.5678@example.net>\r\n" +
		"MIME-Version: 1.0\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Transfer-Encoding: quoted-printable\r\n\r\n")
	for b.Len() < size {
		b.WriteString("The quick brown fox jumps over the lazy dog, again and again and again.\r\n")
	}
	return b.Bytes()
}
