package mime

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"testing"
)

func corpus(f *testing.F) [][]byte {
	f.Helper()
	files, _ := filepath.Glob("testdata/*.eml")
	var out [][]byte
	for _, file := range files {
		b, err := os.ReadFile(file)
		if err != nil {
			f.Fatal(err)
		}
		out = append(out, b)
	}
	return out
}

// FuzzParse: parsing never panics, offsets stay within the message and
// nest, the renderings are well-formed IMAP, the encoding round-trips, and
// how the message is split into writes does not matter.
func FuzzParse(f *testing.F) {
	for _, m := range corpus(f) {
		f.Add(m, uint16(7))
	}
	f.Add([]byte("Content-Type: multipart/mixed; boundary=a\n\n--a\n\n--a\n--a--"), uint16(1))
	f.Add([]byte("Content-Type: message/rfc822\r\n\r\nContent-Type: multipart/x; boundary=\"\"\r\n\r\n"), uint16(3))
	f.Fuzz(func(t *testing.T, msg []byte, split uint16) {
		s, _ := Parse(bytes.NewReader(msg))
		checkSummary(t, msg, s)
		for _, extended := range []bool{false, true} {
			if err := checkIMAPSyntax(s.AppendBodyStructure(nil, extended)); err != nil {
				t.Fatalf("BODYSTRUCTURE %v: %q", err, s.AppendBodyStructure(nil, extended))
			}
		}
		if err := checkIMAPSyntax(s.AppendEnvelope(nil)); err != nil {
			t.Fatalf("ENVELOPE %v: %q", err, s.AppendEnvelope(nil))
		}
		at := int(split) % (len(msg) + 1)
		p := NewParser()
		p.Write(msg[:at])
		p.Write(msg[at:])
		enc1, _ := s.MarshalBinary()
		enc2, _ := p.Summary().MarshalBinary()
		if !bytes.Equal(enc1, enc2) {
			t.Fatalf("split at %d changes the summary", at)
		}
	})
}

// FuzzUnmarshal: decoding arbitrary octets never panics, and whatever it
// accepts satisfies the offset invariants and re-encodes identically.
func FuzzUnmarshal(f *testing.F) {
	for _, m := range corpus(f) {
		s, _ := Parse(bytes.NewReader(m))
		enc, _ := s.MarshalBinary()
		f.Add(enc)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		s, err := Unmarshal(b)
		if err != nil {
			if !errors.Is(err, ErrCorrupt) && !errors.Is(err, ErrVersion) {
				t.Fatalf("unclassified error %v", err)
			}
			return
		}
		checkPart(t, s.Root, 0, s.Size)
		s.AppendBodyStructure(nil, true)
		s.AppendEnvelope(nil)
		for _, path := range [][]int{nil, {1}, {1, 1}, {2, 1}} {
			if pi, ok := s.Part(path); ok && (pi.Body.Start < 0 || pi.Body.End > s.Size) {
				t.Fatalf("Part(%v) = %+v outside %d octets", path, pi, s.Size)
			}
		}
	})
}

// FuzzEnvelope: any address header yields well-formed ENVELOPE address
// lists whose mailboxes are complete and whose groups are balanced.
func FuzzEnvelope(f *testing.F) {
	for _, s := range []string{
		`"Joe Q. Public" <john.q.public@example.com>`, "A Group:Ed Jones <c@a.test>,joe@where.test;",
		"undisclosed-recipients:;", "<@a,@b:c@d>", "a@b (Comment (nested))", `"\`, "<", ":;:;", "x@[1.2.3.4",
		"=?utf-8?q?J=C3=B6rg?= <j@x>", "Jürgen <j@x>", "a\r\n\tb <c@d>",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, v string) {
		l := parseAddressList([]byte(v))
		open := false
		for _, a := range l {
			switch {
			case a.IsGroupStart():
				if open {
					t.Fatalf("nested group in %q: %+v", v, l)
				}
				open = true
			case a.IsGroupEnd():
				if !open {
					t.Fatalf("group end without start in %q: %+v", v, l)
				}
				open = false
			case a.Mailbox == "":
				t.Fatalf("mailbox without local part in %q: %+v", v, l)
			}
		}
		if open {
			t.Fatalf("unclosed group in %q: %+v", v, l)
		}
		env := Envelope{Subject: v, From: l, To: l, MessageID: v}
		if err := checkIMAPSyntax(appendEnvelope(nil, &env)); err != nil {
			t.Fatalf("%v in the ENVELOPE of %q", err, v)
		}
	})
}

// checkIMAPSyntax checks that b is one parenthesized list of IMAP atoms
// (NIL, numbers), quoted strings and literals (RFC 3501 section 9).
func checkIMAPSyntax(b []byte) error {
	depth := 0
	prev := byte(0) // '(' after an open parenthesis, ' ' after a space, 'x' after anything else
	for i := 0; i < len(b); {
		c := b[i]
		switch {
		case c == '(':
			depth++
			i++
		case c == ')':
			depth--
			if depth < 0 {
				return fmt.Errorf("unbalanced ) at %d", i)
			}
			i++
			if depth == 0 && i != len(b) {
				return fmt.Errorf("data after the list at %d", i)
			}
		case c == ' ':
			if prev != 'x' {
				return fmt.Errorf("stray space at %d", i)
			}
			i++
		case c == '"':
			for i++; ; i++ {
				if i >= len(b) {
					return errors.New("unterminated quoted string")
				}
				if b[i] == '\\' {
					i++
					if i >= len(b) || (b[i] != '"' && b[i] != '\\') {
						return fmt.Errorf("bad quoted pair at %d", i)
					}
					continue
				}
				if b[i] == '"' {
					i++
					break
				}
				if b[i] == '\r' || b[i] == '\n' || b[i] == 0 || b[i] >= 0x80 {
					return fmt.Errorf("octet %#x in a quoted string", b[i])
				}
			}
		case c == '{':
			j := bytes.Index(b[i:], []byte("}\r\n"))
			if j < 0 {
				return fmt.Errorf("bad literal at %d", i)
			}
			n, err := strconv.Atoi(string(b[i+1 : i+j]))
			if err != nil || i+j+3+n > len(b) {
				return fmt.Errorf("bad literal length at %d", i)
			}
			if bytes.IndexByte(b[i+j+3:i+j+3+n], 0) >= 0 {
				return errors.New("NUL in a literal")
			}
			i += j + 3 + n
		case bytes.HasPrefix(b[i:], []byte("NIL")):
			i += 3
		case c >= '0' && c <= '9':
			for i < len(b) && b[i] >= '0' && b[i] <= '9' {
				i++
			}
		default:
			return fmt.Errorf("unexpected %q at %d", c, i)
		}
		switch c {
		case '(', ' ':
			prev = c
		default:
			prev = 'x'
		}
		if depth == 0 && i < len(b) {
			return fmt.Errorf("data outside the list at %d", i)
		}
	}
	if depth != 0 {
		return errors.New("unbalanced (")
	}
	return nil
}

// FuzzParseDate: parseDate agrees with mail.ParseDate on any value, and the
// fast path never takes a value mail.ParseDate rejects.
func FuzzParseDate(f *testing.F) {
	for _, tc := range dateCases {
		f.Add(tc.in)
	}
	f.Fuzz(func(t *testing.T, s string) {
		checkParseDate(t, s)
	})
}
