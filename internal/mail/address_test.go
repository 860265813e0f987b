package mail

import (
	"errors"
	"strings"
	"testing"
)

func TestParseAddress(t *testing.T) {
	tests := []struct {
		in          string
		utf8        bool
		local, dom  string
		ok          bool
		str, normal string
	}{
		{"alice@example.org", false, "alice", "example.org", true, "alice@example.org", "alice@example.org"},
		{"Alice.B+tag@Example.ORG.", false, "Alice.B+tag", "Example.ORG.", true, "Alice.B+tag@Example.ORG.", "alice.b+tag@example.org"},
		{`"john smith"@example.org`, false, "john smith", "example.org", true, `"john smith"@example.org`, "john smith@example.org"},
		{`"a\"b"@example.org`, false, `a"b`, "example.org", true, `"a\"b"@example.org`, `a"b@example.org`},
		{`"plain"@example.org`, false, "plain", "example.org", true, "plain@example.org", "plain@example.org"},
		{"user@[192.0.2.1]", false, "user", "[192.0.2.1]", true, "user@[192.0.2.1]", "user@[192.0.2.1]"},
		{"user@[IPv6:2001:db8::1]", false, "user", "[IPv6:2001:db8::1]", true, "user@[IPv6:2001:db8::1]", "user@[ipv6:2001:db8::1]"},
		{"δοκιμή@παράδειγμα.δοκιμή", true, "δοκιμή", "παράδειγμα.δοκιμή", true, "δοκιμή@παράδειγμα.δοκιμή", "δοκιμή@παράδειγμα.δοκιμή"},
		{"δοκιμή@example.org", false, "", "", false, "", ""},
		{"a@b\xff", true, "", "", false, "", ""},
		{"noat", false, "", "", false, "", ""},
		{"@example.org", false, "", "", false, "", ""},
		{"a@", false, "", "", false, "", ""},
		{".a@example.org", false, "", "", false, "", ""},
		{"a.@example.org", false, "", "", false, "", ""},
		{"a..b@example.org", false, "", "", false, "", ""},
		{"a b@example.org", false, "", "", false, "", ""},
		{"a@-example.org", false, "", "", false, "", ""},
		{"a@example-.org", false, "", "", false, "", ""},
		{"a@exa_mple.org", false, "", "", false, "", ""},
		{"a@example..org", false, "", "", false, "", ""},
		{"a@.", false, "", "", false, "", ""},
		{"a@[]", false, "", "", false, "", ""},
		{"a@[1.2.3.4", false, "", "", false, "", ""},
		{`"unterminated@example.org`, false, "", "", false, "", ""},
		{`"a"b@example.org`, false, "", "", false, "", ""},
		{"\"a\x01\"@example.org", false, "", "", false, "", ""},
		{`""@example.org`, false, "", "", false, "", ""},
		{strings.Repeat("l", 64) + "@example.org", false, strings.Repeat("l", 64), "example.org", true, strings.Repeat("l", 64) + "@example.org", strings.Repeat("l", 64) + "@example.org"},
		{strings.Repeat("l", 65) + "@example.org", false, "", "", false, "", ""},
		{"a@" + strings.Repeat("d", 64) + ".org", false, "", "", false, "", ""},
		{"a@" + strings.Repeat("d.", 128) + "org", false, "", "", false, "", ""},
	}
	for _, tt := range tests {
		a, err := ParseAddress(tt.in, tt.utf8)
		if (err == nil) != tt.ok {
			t.Errorf("ParseAddress(%q) error = %v, want ok=%v", tt.in, err, tt.ok)
			continue
		}
		if err != nil {
			if !errors.Is(err, ErrBadAddress) {
				t.Errorf("ParseAddress(%q) error %v does not wrap ErrBadAddress", tt.in, err)
			}
			continue
		}
		if a.Local != tt.local || a.Domain != tt.dom || a.String() != tt.str || a.Normalized() != tt.normal {
			t.Errorf("ParseAddress(%q) = %+v (%q, %q)", tt.in, a, a.String(), a.Normalized())
		}
	}
}

func TestParsePath(t *testing.T) {
	tests := []struct {
		in              string
		allowNull, utf8 bool
		addr, rest      string
		ok              bool
	}{
		{"<alice@example.org>", false, false, "alice@example.org", "", true},
		{"<alice@example.org> SIZE=10", false, false, "alice@example.org", " SIZE=10", true},
		{"<>", true, false, "", "", true},
		{"<> BODY=8BITMIME", true, false, "", " BODY=8BITMIME", true},
		{"<>", false, false, "", "", false},
		{"<@relay1.example,@relay2.example:alice@example.org>", false, false, "alice@example.org", "", true},
		{`<"a>b"@example.org>`, false, false, `"a>b"@example.org`, "", true},
		{"alice@example.org", false, false, "", "", false},
		{"<alice@example.org", false, false, "", "", false},
		{"<@relay.example alice@example.org>", false, false, "", "", false},
		{"<δ@example.org>", false, true, "δ@example.org", "", true},
	}
	for _, tt := range tests {
		a, rest, err := ParsePath(tt.in, tt.allowNull, tt.utf8)
		if (err == nil) != tt.ok {
			t.Errorf("ParsePath(%q) error = %v, want ok=%v", tt.in, err, tt.ok)
			continue
		}
		if err == nil && (a.String() != tt.addr || rest != tt.rest) {
			t.Errorf("ParsePath(%q) = %q, %q", tt.in, a.String(), rest)
		}
	}
}

// FuzzParseAddress: no input panics; an accepted address prints to a form
// that parses back to the same address, within the RFC 5321 limits.
func FuzzParseAddress(f *testing.F) {
	for _, s := range []string{
		"alice@example.org", `"john smith"@example.org`, `"a\"b\\c"@example.org`, "u@[192.0.2.1]",
		"δοκιμή@παράδειγμα.δοκιμή", "a..b@x", "@", `"`, "a@b.", "a@-", strings.Repeat("a", 70) + "@b",
	} {
		f.Add(s, false)
		f.Add(s, true)
	}
	f.Fuzz(func(t *testing.T, s string, allowUTF8 bool) {
		a, err := ParseAddress(s, allowUTF8)
		if err != nil {
			if !errors.Is(err, ErrBadAddress) {
				t.Fatalf("error %v does not wrap ErrBadAddress", err)
			}
			return
		}
		if a.IsNull() || len(a.Local) > MaxLocalPartLen || len(a.Domain) > MaxDomainLen {
			t.Fatalf("accepted out-of-limit address %+v", a)
		}
		b, err := ParseAddress(a.String(), allowUTF8)
		if err != nil || b != a {
			t.Fatalf("%q parsed to %+v, printed %q, re-parsed to %+v, %v", s, a, a.String(), b, err)
		}
		if strings.ContainsAny(a.String(), "\r\n\x00") {
			t.Fatalf("control characters in %q", a.String())
		}
	})
}

// FuzzParsePath: no input panics; the remainder is a suffix of the input.
func FuzzParsePath(f *testing.F) {
	for _, s := range []string{
		"<alice@example.org>", "<> SIZE=1", "<@a,@b:c@d>", `<"x>y"@z>`, "<", "<<>>", `<"\`,
	} {
		f.Add(s, true, false)
	}
	f.Fuzz(func(t *testing.T, s string, allowNull, allowUTF8 bool) {
		a, rest, err := ParsePath(s, allowNull, allowUTF8)
		if err != nil {
			return
		}
		if !strings.HasSuffix(s, rest) {
			t.Fatalf("rest %q is not a suffix of %q", rest, s)
		}
		if a.IsNull() && !allowNull {
			t.Fatalf("null path accepted from %q", s)
		}
	})
}
