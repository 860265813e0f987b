// Package mail is Quill's shared vocabulary, today mail addresses (RFC 5321
// paths and mailboxes). It is pure (no I/O) and every parser in it is fuzzed.
package mail

import (
	"errors"
	"fmt"
	"strings"
	"unicode/utf8"
)

// Limits from RFC 5321 section 4.5.3.1.
const (
	MaxLocalPartLen = 64
	MaxDomainLen    = 255
	MaxPathLen      = 256
)

// ErrBadAddress is wrapped by every address parse failure.
var ErrBadAddress = errors.New("malformed address")

// Address is a parsed mailbox address (RFC 5321 section 4.1.2 "Mailbox").
// The zero Address is the null reverse-path "<>".
type Address struct {
	Local  string // local part as written, quotes removed
	Domain string // domain as written, or an address literal with its brackets
}

// IsNull reports whether a is the null reverse-path.
func (a Address) IsNull() bool { return a.Local == "" && a.Domain == "" }

// String returns local@domain, quoting the local part when RFC 5321 requires it.
func (a Address) String() string {
	if a.IsNull() {
		return ""
	}
	local := a.Local
	if !isDotString(local, true) {
		local = quoteLocal(local)
	}
	return local + "@" + a.Domain
}

// Normalized returns the form Quill uses as a lookup key: the local part and
// the domain lower-cased (Unicode simple folding). RFC 5321 lets a receiving
// host treat local parts case-sensitively; Quill deliberately does not, as
// every mainstream mail server behaves the same way for its own users.
func (a Address) Normalized() string {
	if a.IsNull() {
		return ""
	}
	return strings.ToLower(a.Local) + "@" + strings.ToLower(strings.TrimSuffix(a.Domain, "."))
}

// DomainNormalized returns the lower-cased domain without a trailing dot.
func (a Address) DomainNormalized() string {
	return strings.ToLower(strings.TrimSuffix(a.Domain, "."))
}

// ParseAddress parses "local@domain" without angle brackets. When utf8 is
// true, UTF-8 is allowed in the local part and domain (RFC 6531 SMTPUTF8).
func ParseAddress(s string, allowUTF8 bool) (Address, error) {
	if len(s) > MaxPathLen {
		return Address{}, fmt.Errorf("%w: longer than %d octets", ErrBadAddress, MaxPathLen)
	}
	if !allowUTF8 {
		for i := 0; i < len(s); i++ {
			if s[i] >= 0x80 {
				return Address{}, fmt.Errorf("%w: non-ASCII without SMTPUTF8", ErrBadAddress)
			}
		}
	} else if !utf8.ValidString(s) {
		return Address{}, fmt.Errorf("%w: invalid UTF-8", ErrBadAddress)
	}
	var local string
	var rest string
	if strings.HasPrefix(s, `"`) {
		l, n, err := parseQuoted(s)
		if err != nil {
			return Address{}, err
		}
		local, rest = l, s[n:]
	} else {
		at := strings.LastIndexByte(s, '@')
		if at < 0 {
			return Address{}, fmt.Errorf("%w: no @", ErrBadAddress)
		}
		local, rest = s[:at], s[at:]
		if !isDotString(local, allowUTF8) {
			return Address{}, fmt.Errorf("%w: bad local part", ErrBadAddress)
		}
	}
	if !strings.HasPrefix(rest, "@") {
		return Address{}, fmt.Errorf("%w: no @ after local part", ErrBadAddress)
	}
	domain := rest[1:]
	if len(local) == 0 || len(local) > MaxLocalPartLen {
		return Address{}, fmt.Errorf("%w: local part length", ErrBadAddress)
	}
	if err := checkDomain(domain, allowUTF8); err != nil {
		return Address{}, err
	}
	return Address{Local: local, Domain: domain}, nil
}

// ParsePath parses an SMTP path "<local@domain>" (RFC 5321 section 4.1.2),
// accepting and discarding an obsolete source route ("<@a,@b:x@y>"). The
// null path "<>" is accepted only when allowNull is true. It returns the
// address and whatever followed the closing bracket (the parameters).
func ParsePath(s string, allowNull, allowUTF8 bool) (Address, string, error) {
	if !strings.HasPrefix(s, "<") {
		return Address{}, "", fmt.Errorf("%w: path must be in angle brackets", ErrBadAddress)
	}
	end := closingBracket(s)
	if end < 0 {
		return Address{}, "", fmt.Errorf("%w: no closing bracket", ErrBadAddress)
	}
	inner, rest := s[1:end], s[end+1:]
	if inner == "" {
		if !allowNull {
			return Address{}, "", fmt.Errorf("%w: null path not allowed here", ErrBadAddress)
		}
		return Address{}, rest, nil
	}
	if strings.HasPrefix(inner, "@") {
		colon := strings.IndexByte(inner, ':')
		if colon < 0 {
			return Address{}, "", fmt.Errorf("%w: bad source route", ErrBadAddress)
		}
		inner = inner[colon+1:]
	}
	a, err := ParseAddress(inner, allowUTF8)
	return a, rest, err
}

// closingBracket finds the '>' that ends a path, skipping quoted strings.
func closingBracket(s string) int {
	inQuote := false
	for i := 1; i < len(s); i++ {
		switch c := s[i]; {
		case inQuote && c == '\\':
			i++
		case c == '"':
			inQuote = !inQuote
		case c == '>' && !inQuote:
			return i
		}
	}
	return -1
}

func parseQuoted(s string) (string, int, error) {
	var b strings.Builder
	for i := 1; i < len(s); i++ {
		c := s[i]
		switch {
		case c == '\\':
			if i+1 >= len(s) || s[i+1] < 0x20 || s[i+1] > 0x7e {
				return "", 0, fmt.Errorf("%w: bad quoted pair", ErrBadAddress)
			}
			b.WriteByte(s[i+1])
			i++
		case c == '"':
			return b.String(), i + 1, nil
		case c < 0x20 || c == 0x7f:
			return "", 0, fmt.Errorf("%w: control character in quoted string", ErrBadAddress)
		default:
			b.WriteByte(c)
		}
	}
	return "", 0, fmt.Errorf("%w: unterminated quoted string", ErrBadAddress)
}

// isAtext reports RFC 5322 atext, plus any non-ASCII byte when utf8 is allowed.
func isAtext(c byte, allowUTF8 bool) bool {
	switch {
	case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9':
		return true
	case strings.IndexByte("!#$%&'*+-/=?^_`{|}~", c) >= 0:
		return true
	case c >= 0x80:
		return allowUTF8
	}
	return false
}

func isDotString(s string, allowUTF8 bool) bool {
	if s == "" || s[0] == '.' || s[len(s)-1] == '.' {
		return false
	}
	for i := 0; i < len(s); i++ {
		if s[i] == '.' {
			if s[i-1] == '.' {
				return false
			}
			continue
		}
		if !isAtext(s[i], allowUTF8) {
			return false
		}
	}
	return true
}

func quoteLocal(s string) string {
	var b strings.Builder
	b.WriteByte('"')
	for i := 0; i < len(s); i++ {
		if s[i] == '"' || s[i] == '\\' {
			b.WriteByte('\\')
		}
		b.WriteByte(s[i])
	}
	b.WriteByte('"')
	return b.String()
}

func checkDomain(d string, allowUTF8 bool) error {
	if d == "" || len(d) > MaxDomainLen {
		return fmt.Errorf("%w: domain length", ErrBadAddress)
	}
	if d[0] == '[' {
		if d[len(d)-1] != ']' || len(d) < 3 {
			return fmt.Errorf("%w: bad address literal", ErrBadAddress)
		}
		for i := 1; i < len(d)-1; i++ {
			c := d[i]
			if c < 0x21 || c > 0x7e || c == '[' || c == ']' || c == '\\' {
				return fmt.Errorf("%w: bad address literal", ErrBadAddress)
			}
		}
		return nil
	}
	d = strings.TrimSuffix(d, ".")
	for _, label := range strings.Split(d, ".") {
		if label == "" || len(label) > 63 || label[0] == '-' || label[len(label)-1] == '-' {
			return fmt.Errorf("%w: bad domain label", ErrBadAddress)
		}
		for i := 0; i < len(label); i++ {
			c := label[i]
			ok := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' ||
				(allowUTF8 && c >= 0x80)
			if !ok {
				return fmt.Errorf("%w: bad character in domain", ErrBadAddress)
			}
		}
	}
	return nil
}
