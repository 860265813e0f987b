package imap

import (
	"encoding/base64"
	"errors"
	"strings"
	"unicode/utf16"
	"unicode/utf8"
)

// Mailbox names are stored as UTF-8. An IMAP4rev1 session names them in
// modified UTF-7 (RFC 3501 section 5.1.3) both ways; an IMAP4rev2 session
// (after ENABLE IMAP4rev2) in UTF-8 (RFC 9051 section 5.1), where "&" is an
// ordinary character. The conversion is here, at the protocol edge: the
// decoder converts names and LIST patterns as it reads them
// (decoder.utf7), and encoder.mailbox writes names in the session's form.

// mutf7Base64 is modified BASE64: "," for "/", no padding.
var mutf7Base64 = base64.NewEncoding("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+,").
	WithPadding(base64.NoPadding).Strict()

var errBadMUTF7 = errors.New("imap: mailbox name is not valid modified UTF-7")

// encodeMUTF7 returns s in modified UTF-7. Invalid UTF-8 octets are
// encoded as U+FFFD.
func encodeMUTF7(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); {
		c := s[i]
		if c >= 0x20 && c <= 0x7e {
			b.WriteByte(c)
			if c == '&' {
				b.WriteByte('-')
			}
			i++
			continue
		}
		// A run of characters that cannot represent themselves, as UTF-16
		// in one shift sequence.
		var units []uint16
		for i < len(s) && (s[i] < 0x20 || s[i] > 0x7e) {
			r, n := utf8.DecodeRuneInString(s[i:])
			units = utf16.AppendRune(units, r)
			i += n
		}
		raw := make([]byte, 0, 2*len(units))
		for _, u := range units {
			raw = append(raw, byte(u>>8), byte(u))
		}
		b.WriteByte('&')
		b.WriteString(mutf7Base64.EncodeToString(raw))
		b.WriteByte('-')
	}
	return b.String()
}

// decodeMUTF7 returns the UTF-8 form of a modified UTF-7 name. It accepts
// only the canonical form, which encodeMUTF7 produces: no 8-bit octets,
// "&" only as "&-" or a shift sequence, no printable ASCII inside a shift,
// no adjacent shifts, no stray bits, no unpaired surrogates.
func decodeMUTF7(s string) (string, error) {
	if !strings.Contains(s, "&") {
		for i := 0; i < len(s); i++ {
			if s[i] < 0x20 || s[i] > 0x7e {
				return "", errBadMUTF7
			}
		}
		return s, nil
	}
	var b strings.Builder
	for i := 0; i < len(s); {
		c := s[i]
		switch {
		case c < 0x20 || c > 0x7e:
			return "", errBadMUTF7
		case c != '&':
			b.WriteByte(c)
			i++
			continue
		}
		end := strings.IndexByte(s[i+1:], '-')
		if end < 0 {
			return "", errBadMUTF7
		}
		enc := s[i+1 : i+1+end]
		i += end + 2
		if enc == "" {
			b.WriteByte('&')
			continue
		}
		raw, err := mutf7Base64.DecodeString(enc)
		if err != nil || len(raw)%2 != 0 {
			return "", errBadMUTF7
		}
		units := make([]uint16, len(raw)/2)
		for j := range units {
			units[j] = uint16(raw[2*j])<<8 | uint16(raw[2*j+1])
		}
		for _, r := range utf16.Decode(units) {
			b.WriteRune(r)
		}
	}
	out := b.String()
	// Canonical form only: this also refuses what utf16.Decode replaced
	// with U+FFFD (unpaired surrogates) and ASCII hidden in a shift.
	if encodeMUTF7(out) != s {
		return "", errBadMUTF7
	}
	return out, nil
}
