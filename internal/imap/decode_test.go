package imap

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"strings"
	"testing"
)

// fakeSource serves lines and literal octets from a buffer, as the
// connection does.
type fakeSource struct {
	r     *bufio.Reader
	conts int
}

func newFakeSource(in string) *fakeSource {
	return &fakeSource{r: bufio.NewReaderSize(strings.NewReader(in), 4096)}
}

func (f *fakeSource) ReadLine() ([]byte, error) {
	line, err := f.r.ReadSlice('\n')
	if err != nil {
		if errors.Is(err, bufio.ErrBufferFull) {
			return nil, errors.New("line too long")
		}
		return nil, err
	}
	return bytes.TrimSuffix(bytes.TrimSuffix(line, []byte("\n")), []byte("\r")), nil
}
func (f *fakeSource) Reader() *bufio.Reader { return f.r }
func (f *fakeSource) Continue(string) error { f.conts++; return nil }

// decodeCommand parses one command line the way the session does, but
// without running it: the argument grammar of each command that has one of
// its own, and a generic walk (strings, lists, literals) for the rest.
func decodeCommand(src source, maxLiteral int64) (string, error) {
	line, err := src.ReadLine()
	if err != nil {
		return "", err
	}
	d := newDecoder(src, line, maxLiteral, 8)
	err = func() error {
		if _, err := d.atom("]"); err != nil {
			return err
		}
		if err := d.sp(); err != nil {
			return err
		}
		name, err := d.atom("")
		if err != nil {
			return err
		}
		name = strings.ToUpper(name)
		if name == "UID" {
			if err := d.sp(); err != nil {
				return err
			}
			if name, err = d.atom(""); err != nil {
				return err
			}
			name = strings.ToUpper(name)
		}
		switch name {
		case "FETCH", "STORE", "COPY", "MOVE":
			if err := d.sp(); err != nil {
				return err
			}
			if _, err := d.seqSet(); err != nil {
				return err
			}
			if err := d.sp(); err != nil {
				return err
			}
			switch name {
			case "FETCH":
				_, err = parseFetchAtts(d)
			case "STORE":
				if _, err = d.atom(""); err == nil {
					if err = d.sp(); err == nil {
						_, err = d.flagList()
					}
				}
			default:
				_, err = d.mailbox()
			}
			if err != nil {
				return err
			}
		case "LIST":
			var opt listOptions
			if err := d.sp(); err != nil {
				return err
			}
			if d.peek() == '(' {
				if err := parseListSelect(d, &opt); err != nil {
					return err
				}
				if err := d.sp(); err != nil {
					return err
				}
			}
			if _, err := d.mailbox(); err != nil {
				return err
			}
			if err := d.sp(); err != nil {
				return err
			}
			if _, err := d.listMailbox(); err != nil {
				return err
			}
			if d.accept(' ') {
				if err := parseListReturn(d, &opt); err != nil {
					return err
				}
			}
		case "SORT":
			if err := d.sp(); err != nil {
				return err
			}
			if _, err := parseSortCriteria(d); err != nil {
				return err
			}
			if err := d.sp(); err != nil {
				return err
			}
			if err := parseCharset(d); err != nil {
				return err
			}
			if err := d.sp(); err != nil {
				return err
			}
			p := searchParser{d: d}
			if _, err := p.keys(); err != nil {
				return err
			}
		case "SELECT":
			if err := d.sp(); err != nil {
				return err
			}
			if _, err := d.mailbox(); err != nil {
				return err
			}
			if d.accept(' ') {
				if err := d.expect('('); err != nil {
					return err
				}
				if _, err := d.atom(""); err != nil {
					return err
				}
				var qr qresyncParams
				if err := parseQresync(d, &qr); err != nil {
					return err
				}
				if err := d.expect(')'); err != nil {
					return err
				}
			}
		case "STATUS":
			if err := d.sp(); err != nil {
				return err
			}
			if _, err := d.mailbox(); err != nil {
				return err
			}
			if err := d.sp(); err != nil {
				return err
			}
			if _, err := parseStatusItems(d); err != nil {
				return err
			}
		case "SEARCH":
			if err := d.sp(); err != nil {
				return err
			}
			p := searchParser{d: d}
			if _, err := p.keys(); err != nil {
				return err
			}
		default:
			for !d.eol() {
				if err := d.sp(); err != nil {
					return err
				}
				switch d.peek() {
				case '(':
					err = d.list(func() error { _, err := d.astring(); return err })
				default:
					_, err = d.astring()
				}
				if err != nil {
					return err
				}
			}
		}
		return d.end()
	}()
	if err != nil {
		if derr := d.discard(); derr != nil {
			return "", derr
		}
		return "", err
	}
	return "ok", nil
}

func TestDecodeCommand(t *testing.T) {
	for _, tc := range []struct {
		in      string
		ok      bool
		conts   int
		rest    string // what the next ReadLine returns
		errText string
	}{
		{in: "a FETCH 1:* (FLAGS BODY.PEEK[HEADER.FIELDS (A B)]<0.5>)\r\nnext\r\n", ok: true, rest: "next"},
		{in: "a LOGIN {3}\r\nbob \"pw\\\"x\"\r\nnext\r\n", ok: true, conts: 1, rest: "next"},
		{in: "a LOGIN {3+}\r\nbob pw\r\nnext\r\n", ok: true, rest: "next"},
		// A refused non-synchronizing literal is skipped, octets and all.
		{in: "a LOGIN {20+}\r\n01234567890123456789 x\r\nnext\r\n", errText: "literal too large", rest: "next"},
		// A refused synchronizing literal is never sent by the client.
		{in: "a LOGIN {20}\r\nnext\r\n", errText: "literal too large", rest: "next"},
		{in: "a LOGIN \"unterminated\r\nnext\r\n", errText: "unterminated quoted string", rest: "next"},
		{in: "a SEARCH " + strings.Repeat("(", 20) + "ALL" + strings.Repeat(")", 20) + "\r\nnext\r\n", errText: "nested too deeply", rest: "next"},
		{in: "a SEARCH OR (SEEN FLAGGED) NOT UID 1:5,7 SINCE 1-Jan-2024\r\n", ok: true},
		{in: "a FETCH 1:x FLAGS\r\n", errText: "expected"},
		{in: "a STORE 1 +FLAGS (\\seen \\Bogus kw)\r\n", ok: true},
		{in: "a X {1+}\r\na {1+}\r\nb {1+}\r\nc {1+}\r\nd {1+}\r\ne {1+}\r\nf {1+}\r\ng {1+}\r\nh {1+}\r\ni\r\nnext\r\n", errText: "too many literals", rest: "next"},
	} {
		src := newFakeSource(tc.in)
		got, err := decodeCommand(src, 10)
		if tc.ok != (err == nil) || (err != nil && !strings.Contains(err.Error(), tc.errText)) {
			t.Errorf("%q: got %q, %v; want ok=%v err~%q", tc.in, got, err, tc.ok, tc.errText)
		}
		if src.conts != tc.conts {
			t.Errorf("%q: %d continuation requests, want %d", tc.in, src.conts, tc.conts)
		}
		if tc.rest != "" {
			line, err := src.ReadLine()
			if err != nil || string(line) != tc.rest {
				t.Errorf("%q: next line %q, %v; want %q", tc.in, line, err, tc.rest)
			}
		}
	}
}

func TestEncoderStrings(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"plain", `"plain"`},
		{`a"b\c`, `"a\"b\\c"`},
		{"two\r\nlines", "{10}\r\ntwo\r\nlines"},
		{"caf\xc3\xa9", "{5}\r\ncaf\xc3\xa9"},
	} {
		var b bytes.Buffer
		e := encoder{w: &b}
		e.str(tc.in)
		if b.String() != tc.want {
			t.Errorf("str(%q) = %q, want %q", tc.in, b.String(), tc.want)
		}
		d := newDecoder(newFakeSource(strings.TrimPrefix(b.String(), strings.SplitN(b.String(), "\r\n", 2)[0]+"\r\n")+"\r\n"), []byte(strings.SplitN(b.String(), "\r\n", 2)[0]), 1<<10, 1)
		got, err := d.str()
		if err != nil || got != tc.in {
			t.Errorf("round trip of %q: %q, %v", tc.in, got, err)
		}
	}
}

func TestMatch(t *testing.T) {
	for _, tc := range []struct {
		pat, name string
		want      bool
	}{
		{"*", "a/b/c", true}, {"%", "a/b", false}, {"%", "a", true}, {"a/%", "a/b", true},
		{"a/%", "a/b/c", false}, {"a*c", "a/b/c", true}, {"a%c", "a/c", false}, {"", "", true},
		{"INBOX", "INBOX", true}, {strings.Repeat("*", 500) + "x", strings.Repeat("a", 1000), false},
	} {
		if got := match(tc.pat, tc.name); got != tc.want {
			t.Errorf("match(%q, %q) = %v", tc.pat, tc.name, got)
		}
	}
}

// FuzzDecodeCommand feeds arbitrary input to the command decoder: it must
// never panic, never read a literal beyond its bound, and after a refusal
// leave the source at a line boundary.
func FuzzDecodeCommand(f *testing.F) {
	for _, seed := range []string{
		"a1 LOGIN alice secret\r\n",
		"a1 LOGIN {5}\r\nalice {6+}\r\nsecret\r\n",
		"a2 FETCH 1:*,3 (UID FLAGS BODY.PEEK[1.2.HEADER.FIELDS.NOT (To)]<0.100> RFC822.SIZE)\r\n",
		"a3 UID SEARCH CHARSET UTF-8 OR (FROM \"x\" TO y) NOT BODY {3}\r\nabc\r\n",
		"a4 STORE $ +FLAGS.SILENT (\\Seen $Label)\r\n",
		"a5 APPEND INBOX (\\Seen) \" 1-Jan-2024 10:00:00 +0000\" {3+}\r\nabc\r\n",
		"a6 SEARCH RETURN (MIN COUNT) 1:5 LARGER 10 SINCE 2-Feb-2020\r\n",
		"a7 CREATE foo (USE (\\Sent))\r\n",
		"a8 LIST \"\" %/*\r\n",
		"a9 X {99999999999999999999}\r\n",
		"b ((((((((((((((((((((\r\n",
		"c1 LIST (SUBSCRIBED RECURSIVEMATCH) \"\" \"*\" RETURN (SUBSCRIBED STATUS (MESSAGES HIGHESTMODSEQ))\r\n",
		"c2 SELECT INBOX (QRESYNC (67890007 20050715194045000 41,43:211,214:541 (1:3 5:7)))\r\n",
		"c3 UID FETCH 1:* (FLAGS BINARY.PEEK[1.2]<0.10> BINARY.SIZE[2] MODSEQ)\r\n",
		"c4 SEARCH MODSEQ \"/flags/\\\\draft\" all 620162338\r\n",
		"c5 STATUS INBOX (MESSAGES DELETED SIZE)\r\n",
		"c6 UID SORT (REVERSE DATE SUBJECT DISPLAYFROM) UTF-8 OR FROM {1}\r\nx SINCE 1-Jan-2024\r\n",
		"c7 SORT (REVERSE REVERSE SIZE) US-ASCII ALL\r\n",
		"\r\n",
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, in []byte) {
		src := newFakeSource(string(in))
		for range 8 {
			_, err := decodeCommand(src, 64)
			if err != nil && (errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, errResync) ||
				strings.Contains(err.Error(), "line too long") || strings.Contains(err.Error(), "EOF")) {
				return
			}
		}
	})
}

func BenchmarkDecodeFetch(b *testing.B) {
	in := "a1 UID FETCH 1:1000,2000:* (UID FLAGS RFC822.SIZE BODY.PEEK[HEADER.FIELDS (From To Subject Date Message-ID)])\r\n"
	b.ReportAllocs()
	for b.Loop() {
		if _, err := decodeCommand(newFakeSource(in), 64); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkEncodeFetchFlags(b *testing.B) {
	var buf bytes.Buffer
	e := encoder{w: &buf}
	flags := []string{`\Answered`, `\Seen`, "$Label1"}
	b.ReportAllocs()
	for i := range b.N {
		buf.Reset()
		e.raw("* ").num(uint32(i)).raw(" FETCH (UID ").num(uint32(i)).raw(" FLAGS ").flags(flags, false).raw(")").crlf()
	}
}
