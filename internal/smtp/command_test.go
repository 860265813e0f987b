package smtp

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"strings"
	"testing"
	"unicode/utf8"
)

func TestParseCommand(t *testing.T) {
	tests := []struct {
		line, verb, arg string
		code            int // 0: no error
	}{
		{"ehlo client.example", "EHLO", "client.example", 0},
		{"MAIL FROM:<a@b>  ", "MAIL", "FROM:<a@b>", 0},
		{"QUIT", "QUIT", "", 0},
		{"", "", "", 0},
		{"NO\x00OP", "", "", 500},
		{"NOOP\r", "", "", 500},
		{"\xff\xfe", "", "", 500},
		{"M4IL FROM:<>", "", "", 500},
		{"ABCDEFGHIJKLMNOPQ x", "", "", 500},
		{"HELO\tx", "", "", 500},
	}
	for _, tt := range tests {
		cmd, err := parseCommand(tt.line)
		if code := replyCode(err); code != tt.code || err == nil && (cmd.verb != tt.verb || cmd.arg != tt.arg) {
			t.Errorf("parseCommand(%q) = %+v, %v; want %s %q code %d", tt.line, cmd, err, tt.verb, tt.arg, tt.code)
		}
	}
}

func replyCode(err error) int {
	if err == nil {
		return 0
	}
	r, _ := replyFor(err)
	return r.code
}

func TestParseMail(t *testing.T) {
	tests := []struct {
		arg   string
		esmtp bool
		from  string
		size  int64
		utf8  bool
		code  int
	}{
		{"FROM:<a@b.example>", true, "a@b.example", 0, false, 0},
		{"from: <a@b.example> size=42 body=8bitmime", true, "a@b.example", 42, false, 0},
		{"FROM:<>", true, "", 0, false, 0},
		{"FROM:<@hop.example:a@b.example>", true, "a@b.example", 0, false, 0},
		{`FROM:<"john smith"@b.example>`, true, `"john smith"@b.example`, 0, false, 0},
		{"FROM:<δ@b.example> SMTPUTF8", true, "δ@b.example", 0, true, 0},
		{"FROM:<a@b.example> AUTH=<>", true, "a@b.example", 0, false, 0},
		{"FROM:<δ@b.example>", true, "", 0, false, 553},
		{"FROM:<a@b.example> SIZE=1", false, "", 0, false, 555},
		{"FROM:<a@b.example> SIZE=-1", true, "", 0, false, 501},
		{"FROM:<a@b.example> SIZE=+1", true, "", 0, false, 501},
		{"FROM:<a@b.example> SIZE=", true, "", 0, false, 501},
		{"FROM:<a@b.example> SMTPUTF8=yes", true, "", 0, false, 501},
		{"FROM:<a@b.example> X=1 x=2", true, "", 0, false, 501},
		{"FROM:<a@b.example> ENVID=x", true, "", 0, false, 555},
		{"FROM:<a@b.example> =x", true, "", 0, false, 501},
		{"FROM:<a@b.example>x", true, "", 0, false, 501},
		{"FROM:a@b.example", true, "", 0, false, 553},
		{"FROM:<a@b.example", true, "", 0, false, 553},
		{"TO:<a@b.example>", true, "", 0, false, 501},
		{"FROM:<a@-b.example>", true, "", 0, false, 553},
	}
	for _, tt := range tests {
		m, err := parseMail(tt.arg, tt.esmtp)
		if code := replyCode(err); code != tt.code {
			t.Errorf("parseMail(%q) error %v, want code %d", tt.arg, err, tt.code)
			continue
		}
		if err == nil && (m.from.String() != tt.from || m.size != tt.size || m.smtpUTF8 != tt.utf8) {
			t.Errorf("parseMail(%q) = %+v", tt.arg, m)
		}
	}
}

func TestParseRcpt(t *testing.T) {
	tests := []struct {
		arg  string
		utf8 bool
		want string
		code int
	}{
		{"TO:<alice@example.org>", false, "alice@example.org", 0},
		{"to: <Alice@Example.org>", false, "Alice@Example.org", 0},
		{"TO:<Postmaster>", false, "postmaster@", 0},
		{"TO:<postmaster> X=1", false, "", 555},
		{"TO:<δ@example.org>", true, "δ@example.org", 0},
		{"TO:<δ@example.org>", false, "", 553},
		{"TO:<>", false, "", 553},
		{"TO:<a@b.example> NOTIFY=NEVER", false, "", 555},
		{"FROM:<a@b.example>", false, "", 501},
	}
	for _, tt := range tests {
		a, err := parseRcpt(tt.arg, tt.utf8)
		if code := replyCode(err); code != tt.code {
			t.Errorf("parseRcpt(%q) error %v, want code %d", tt.arg, err, tt.code)
			continue
		}
		if err == nil && a.Local+"@"+a.Domain != tt.want {
			t.Errorf("parseRcpt(%q) = %+v, want %s", tt.arg, a, tt.want)
		}
	}
}

func TestParseBDAT(t *testing.T) {
	tests := []struct {
		arg      string
		size     int64
		last, ok bool
		code     int
	}{
		{"100", 100, false, true, 0},
		{"0 LAST", 0, true, true, 0},
		{"7 last", 7, true, true, 0},
		{"7 MORE", 7, false, true, 501},
		{"", 0, false, true, 501},
		{"x", 0, false, false, 501},
		{"-1", 0, false, false, 501},
		{"99999999999999999999", 0, false, false, 501},
		{"1 LAST extra", 0, false, false, 501},
	}
	for _, tt := range tests {
		size, last, ok, err := parseBDAT(tt.arg)
		if replyCode(err) != tt.code || ok != tt.ok || ok && (size != tt.size || last != tt.last) {
			t.Errorf("parseBDAT(%q) = %d %v %v %v", tt.arg, size, last, ok, err)
		}
	}
}

// FuzzParseCommand checks that no command line makes the parsers panic and
// that what they accept is well formed.
func FuzzParseCommand(f *testing.F) {
	for _, s := range []string{
		"EHLO client.example", "MAIL FROM:<a@b.example> SIZE=100 BODY=8BITMIME",
		"MAIL FROM:<> SMTPUTF8", `MAIL FROM:<"q\"x"@b.example>`, "MAIL FROM:<@r1,@r2:a@b>",
		"RCPT TO:<postmaster>", "RCPT TO:<δ@example.org>", "BDAT 10 LAST", "BDAT x",
		"AUTH PLAIN AGFsaWNl", "MAIL FROM:<a@[192.0.2.1]>", "RCPT TO:<a@b.> NOTIFY=NEVER",
		"\x00", "MAIL FROM:<a@b> A=1 A=2", "mail from:<a@b> size=18446744073709551616",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, line string) {
		cmd, err := parseCommand(line)
		if err != nil {
			return
		}
		if cmd.verb != strings.ToUpper(cmd.verb) || !utf8.ValidString(cmd.arg) {
			t.Fatalf("bad command %+v", cmd)
		}
		var perr error
		switch cmd.verb {
		case "MAIL":
			var m mailArgs
			m, perr = parseMail(cmd.arg, true)
			if perr == nil && m.size < 0 {
				t.Fatalf("negative size from %q", line)
			}
			if perr == nil && !m.from.IsNull() {
				if _, _, err := parseMailRoundTrip(m); err != nil {
					t.Fatalf("accepted %q but its address %q does not re-parse: %v", line, m.from.String(), err)
				}
			}
		case "RCPT":
			_, perr = parseRcpt(cmd.arg, true)
		case "BDAT":
			var size int64
			var ok bool
			size, _, ok, perr = parseBDAT(cmd.arg)
			if ok && size < 0 {
				t.Fatalf("negative BDAT size from %q", line)
			}
		}
		if perr != nil {
			if _, known := replyFor(perr); !known {
				t.Fatalf("parser error %v has no reply", perr)
			}
		}
	})
}

func parseMailRoundTrip(m mailArgs) (mailArgs, string, error) {
	again, err := parseMail("FROM:<"+m.from.String()+">", true)
	return again, "", err
}

// decodeData runs the DATA decoder over input with the given limits.
func decodeData(input string, maxSize int64, maxLine int) (string, error, *dataReader) {
	r := newDataReader(bufio.NewReaderSize(strings.NewReader(input), 16), maxSize, maxLine)
	out, err := io.ReadAll(r)
	return string(out), err, r
}

func TestDataReader(t *testing.T) {
	tests := []struct {
		in, out string
		err     error
	}{
		{".\r\n", "", nil},
		{"a\r\n.\r\n", "a\r\n", nil},
		{"a\n.\r\n", "a\r\n.\r\n", io.ErrUnexpectedEOF}, // LF before "." is not the end
		{"a\r\n.\n.\r\n", "a\r\n.\r\n", io.ErrUnexpectedEOF},
		{"..x\r\n..\r\n.\r\n", ".x\r\n.\r\n", nil},
		{"long line of text\r\n.\r\n", "", errDataLineTooLong},
		{"123456789\r\n123456789\r\n123456789\r\n.\r\n", "", errMessageTooBig},
		{"a\rb\r\n.\r\n", "a\rb\r\n", nil},
		{"no end", "no end", io.ErrUnexpectedEOF},
	}
	for _, tt := range tests {
		out, err, _ := decodeData(tt.in, 25, 12)
		if !errors.Is(err, tt.err) || err == nil && out != tt.out {
			t.Errorf("decode(%q) = %q, %v; want %q, %v", tt.in, out, err, tt.out, tt.err)
		}
	}
	// A line split across buffer fills keeps its CRLF and its stuffing.
	long := strings.Repeat("x", 100)
	out, err, _ := decodeData("."+long+"\r\n.\r\n", 1000, 1000)
	if err != nil || out != long+"\r\n" {
		t.Errorf("split line: %q, %v", out, err)
	}
	// After a limit error, drain finds the end and leaves what follows.
	br := bufio.NewReaderSize(strings.NewReader(strings.Repeat("y", 500)+"\r\n.\r\nNEXT\r\n"), 16)
	r := newDataReader(br, 10, 1000)
	if _, err := io.ReadAll(r); !errors.Is(err, errMessageTooBig) {
		t.Fatalf("want errMessageTooBig, got %v", err)
	}
	if err := r.drain(); err != nil {
		t.Fatal(err)
	}
	if rest, _ := io.ReadAll(br); string(rest) != "NEXT\r\n" {
		t.Fatalf("after drain: %q", rest)
	}
}

// FuzzDataReader: the decoder never panics, its output has only CRLF line
// endings, and it never returns more than the limit.
func FuzzDataReader(f *testing.F) {
	for _, s := range []string{".\r\n", "a\r\n.\r\n", "..a\n.\n\r\n.\r\n", "x\r", "\r\r\n\n.\r\n", strings.Repeat("z", 40) + "\r\n.\r\n"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, in string) {
		out, err, r := decodeData(in, 64, 32)
		if int64(len(out)) > 64 {
			t.Fatalf("output %d > limit", len(out))
		}
		if i := strings.Index(strings.ReplaceAll(out, "\r\n", ""), "\n"); i >= 0 {
			t.Fatalf("bare LF in output %q", out)
		}
		if err == nil && !r.eofSeen {
			t.Fatal("nil error without end of data")
		}
		if err != nil && !errors.Is(err, io.ErrUnexpectedEOF) {
			if derr := r.drain(); derr != nil && !errors.Is(derr, io.ErrUnexpectedEOF) {
				t.Fatalf("drain: %v", derr)
			}
		}
	})
}

func TestCRLFNormalizer(t *testing.T) {
	for in, want := range map[string]string{
		"a\nb\r\nc\n": "a\r\nb\r\nc\r\n",
		"\n\n":        "\r\n\r\n",
		"no newline":  "no newline",
		"cr\r":        "cr\r",
	} {
		// One byte at a time: a CRLF split across reads must not double.
		got, err := io.ReadAll(newCRLFNormalizer(io.LimitReader(&oneByteReader{s: in}, 1<<20)))
		if err != nil || string(got) != want {
			t.Errorf("normalize(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	if got, _ := io.ReadAll(newCRLFNormalizer(bytes.NewReader([]byte("x\r")))); string(got) != "x\r" {
		t.Errorf("trailing CR: %q", got)
	}
}

type oneByteReader struct{ s string }

func (r *oneByteReader) Read(p []byte) (int, error) {
	if r.s == "" {
		return 0, io.EOF
	}
	if len(p) == 0 {
		return 0, nil
	}
	p[0] = r.s[0]
	r.s = r.s[1:]
	return 1, nil
}
