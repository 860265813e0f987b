package store

import (
	"fmt"
	"io"
	"strings"
	"unicode/utf8"
)

// Delimiter separates the levels of a mailbox name.
const Delimiter = "/"

// CanonicalName validates a mailbox name and spells INBOX, and the first
// level of its inferiors, in upper case: INBOX is case-insensitive (RFC 3501
// section 5.1). Every engine applies it, so all accept the same names.
func CanonicalName(name string) (string, error) {
	if name == "" || len(name) > 1024 || !utf8.ValidString(name) || strings.ContainsAny(name, "\x00\r\n") ||
		strings.HasPrefix(name, Delimiter) || strings.HasSuffix(name, Delimiter) || strings.Contains(name, Delimiter+Delimiter) {
		return "", fmt.Errorf("%w: mailbox name %q", ErrInvalid, name)
	}
	first, rest, hasRest := strings.Cut(name, Delimiter)
	if strings.EqualFold(first, "INBOX") {
		if hasRest {
			return "INBOX" + Delimiter + rest, nil
		}
		return "INBOX", nil
	}
	return name, nil
}

// FillChunk reads a body into buf until buf is full or r reports io.EOF,
// the rule by which every engine's PutBlob reads: only io.EOF itself ends a
// body. Any other error, io.ErrUnexpectedEOF included (what a reader reports
// for a client gone mid-message), is returned, so that a truncated body is
// never stored as if it were whole.
func FillChunk(r io.Reader, buf []byte) (n int, eof bool, err error) {
	for n < len(buf) {
		m, err := r.Read(buf[n:])
		n += m
		if err == io.EOF {
			return n, true, nil
		}
		if err != nil {
			return n, false, err
		}
	}
	return n, false, nil
}
