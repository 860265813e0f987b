package auth

import (
	"bytes"
	"testing"
	"unicode/utf8"
)

// FuzzParsePlain: any message either fails with ErrMalformed or yields
// fields that are valid UTF-8, within RFC 4616's 255-octet bounds, and
// that rebuild the message exactly.
func FuzzParsePlain(f *testing.F) {
	for _, s := range []string{"\x00alice\x00secret", "alice\x00alice\x00pw", "\x00\x00pw", "a\x00b", "\x00a\x00b\x00c", "\x00\xff\x00pw", ""} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, msg []byte) {
		z, u, p, err := ParsePlain(msg)
		if err != nil {
			if err != ErrMalformed {
				t.Fatalf("error %v, want ErrMalformed", err)
			}
			return
		}
		if u == "" || len(u) > 255 || len(p) > 255 {
			t.Fatalf("authcid %q, passwd of %d octets accepted", u, len(p))
		}
		for _, s := range []string{z, u, p} {
			if !utf8.ValidString(s) {
				t.Fatalf("%q is not UTF-8", s)
			}
		}
		if got := []byte(z + "\x00" + u + "\x00" + p); !bytes.Equal(got, msg) {
			t.Fatalf("fields %q %q %q rebuild %q, not %q", z, u, p, got, msg)
		}
	})
}
