package imap

import (
	"bytes"
	"fmt"
	"io"
	stdmime "mime"
	"strings"
	"unicode/utf8"

	"golang.org/x/text/encoding/charmap"
	"golang.org/x/text/encoding/htmlindex"
)

// Header keys of SEARCH (SUBJECT, FROM, TO, CC, BCC, HEADER; RFC 9051
// section 6.4.4) compare the search string with the decoded text of the
// field, case-insensitively: RFC 2047 encoded words are decoded in any
// charset the WHATWG index knows (ISO-8859-1, windows-1252, KOI8-R,
// ISO-2022-JP...), a field holding raw 8-bit octets is taken as UTF-8
// (RFC 6532) when valid and as ISO-8859-1 otherwise, and every field of
// that name is tried, not only the first. The stored summaries keep only
// the envelope fields, so the header is read from the message; a field
// longer than maxSearchField octets is compared on its first
// maxSearchField octets.

// maxSearchField bounds the unfolded field value kept for one comparison.
const maxSearchField = 64 << 10

// searchCharsetReader decodes a charset named by an encoded word.
func searchCharsetReader(charset string, r io.Reader) (io.Reader, error) {
	enc, err := htmlindex.Get(charset)
	if err != nil {
		return nil, fmt.Errorf("imap: unknown charset %q: %w", charset, err)
	}
	return enc.NewDecoder().Reader(r), nil
}

var wordDecoder = &stdmime.WordDecoder{CharsetReader: searchCharsetReader}

// decodeFieldText returns the text of an unfolded field value, as the
// comment above says. A malformed encoded word is left as it stands.
func decodeFieldText(v []byte) string {
	s := string(v)
	if !utf8.ValidString(s) {
		if d, err := charmap.ISO8859_1.NewDecoder().String(s); err == nil {
			s = d
		}
	}
	if !strings.Contains(s, "=?") {
		return s
	}
	if d, err := wordDecoder.DecodeHeader(s); err == nil {
		return d
	}
	return s
}

// headerFieldsMatch reports whether a field called name in hdr (a message
// header through its empty line, or all of it) contains needle in its
// decoded text. An empty needle matches any message with the field.
func headerFieldsMatch(hdr []byte, name, needle string) bool {
	needle = strings.ToLower(needle)
	return eachField(hdr, func(n, v []byte) bool {
		return strings.EqualFold(string(n), name) &&
			strings.Contains(strings.ToLower(decodeFieldText(v)), needle)
	})
}

// headerTextMatch reports whether any field of hdr, as "Name: decoded
// text", contains needle, which is already lower case (SEARCH TEXT and the
// headers of encapsulated messages, searchbody.go).
func headerTextMatch(hdr, needle []byte) bool {
	var raw, low []byte
	return eachField(hdr, func(n, v []byte) bool {
		raw = append(append(append(raw[:0], n...), ": "...), decodeFieldText(v)...)
		low = appendLower(low[:0], raw)
		return bytes.Contains(low, needle)
	})
}

// eachField calls f with the name and unfolded value (up to
// maxSearchField octets) of each field of hdr, through the empty line that
// ends the header, until f returns true; it reports whether one did.
func eachField(hdr []byte, f func(name, value []byte) bool) bool {
	var name, val []byte
	in := false
	for len(hdr) > 0 {
		i := bytes.IndexByte(hdr, '\n')
		line := hdr
		if i >= 0 {
			line = hdr[:i+1]
		}
		hdr = hdr[len(line):]
		trimmed := bytes.TrimRight(line, "\r\n")
		if len(trimmed) == 0 {
			break
		}
		if line[0] == ' ' || line[0] == '\t' {
			if in && len(val) < maxSearchField {
				val = append(val, trimmed[:min(len(trimmed), maxSearchField-len(val))]...)
			}
			continue
		}
		if in && f(name, val) {
			return true
		}
		n, v, ok := bytes.Cut(trimmed, []byte(":"))
		in = ok
		name, val = bytes.TrimSpace(n), val[:0]
		if in {
			v = bytes.TrimLeft(v, " \t")
			val = append(val, v[:min(len(v), maxSearchField)]...)
		}
	}
	return in && f(name, val)
}
