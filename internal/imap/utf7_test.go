package imap

import (
	"testing"
	"unicode/utf8"
)

func TestMUTF7(t *testing.T) {
	for _, c := range []struct{ utf8, mutf7 string }{
		{"INBOX", "INBOX"},
		{"", ""},
		{"Tom & Jerry", "Tom &- Jerry"},
		{"&", "&-"},
		{"Entwürfe", "Entw&APw-rfe"},
		// RFC 3501 section 5.1.3's example.
		{"~peter/mail/台北/日本語", "~peter/mail/&U,BTFw-/&ZeVnLIqe-"},
		{"😀", "&2D3eAA-"},       // a surrogate pair
		{"a\tb", "a&AAk-b"},     // controls cannot represent themselves
		{"ü&ü", "&APw-&-&APw-"}, // "&-" between two shifts
	} {
		if got := encodeMUTF7(c.utf8); got != c.mutf7 {
			t.Errorf("encode(%q) = %q, want %q", c.utf8, got, c.mutf7)
		}
		if got, err := decodeMUTF7(c.mutf7); err != nil || got != c.utf8 {
			t.Errorf("decode(%q) = %q, %v; want %q", c.mutf7, got, err, c.utf8)
		}
	}
	for _, bad := range []string{
		"Entw&APw",   // unterminated shift
		"Café",       // 8-bit octet
		"&AGE-",      // printable ASCII inside a shift
		"&APw-&APw-", // adjacent shifts
		"&2D3-",      // unpaired high surrogate
		"&3gA-",      // unpaired low surrogate
		"&APx-",      // stray bits
		"&AP.-",      // not modified BASE64
		"&APw=-",     // padding
		"&AP-",       // an odd number of octets
		"a\x00b",     // control octet outside a shift
		"&U/BTFw-",   // "/" instead of ","
	} {
		if got, err := decodeMUTF7(bad); err == nil {
			t.Errorf("decode(%q) = %q, want an error", bad, got)
		}
	}
}

// FuzzMUTF7 checks that decoding accepts exactly the canonical encodings:
// what decodes re-encodes to the input, and every UTF-8 string survives a
// round trip.
func FuzzMUTF7(f *testing.F) {
	for _, s := range []string{"INBOX", "Entw&APw-rfe", "&-", "~peter/mail/&U,BTFw-/&ZeVnLIqe-", "&2D3eAA-", "&APw", "Entwürfe", "日本語"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		if u, err := decodeMUTF7(s); err == nil {
			if !utf8.ValidString(u) {
				t.Fatalf("decode(%q) = %q, not UTF-8", s, u)
			}
			if e := encodeMUTF7(u); e != s {
				t.Fatalf("decode(%q) = %q, which encodes to %q", s, u, e)
			}
		}
		if !utf8.ValidString(s) {
			return
		}
		e := encodeMUTF7(s)
		if u, err := decodeMUTF7(e); err != nil || u != s {
			t.Fatalf("encode(%q) = %q, which decodes to %q, %v", s, e, u, err)
		}
	})
}
