package imap

import (
	"io"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"
)

// writer is where responses go: the connection's buffered writer.
type writer interface {
	io.Writer
	io.StringWriter
}

// encoder writes response syntax (RFC 9051 sections 4 and 7) straight into
// the connection's buffer: numbers through a scratch array, strings as
// atoms, quoted strings or literals as their content requires, so that
// writing a response allocates nothing. Write errors are sticky in the
// buffered writer and surface at the next flush.
type encoder struct {
	w       writer
	scratch [32]byte
}

func (e *encoder) raw(s string) *encoder      { _, _ = e.w.WriteString(s); return e }
func (e *encoder) bytes(b []byte) *encoder    { _, _ = e.w.Write(b); return e }
func (e *encoder) sp() *encoder               { return e.raw(" ") }
func (e *encoder) crlf() *encoder             { return e.raw("\r\n") }
func (e *encoder) num(n uint32) *encoder      { return e.num64(uint64(n)) }
func (e *encoder) num64(n uint64) *encoder    { return e.bytes(strconv.AppendUint(e.scratch[:0], n, 10)) }
func (e *encoder) untagged(s string) *encoder { return e.raw("* ").raw(s) }

// quotable reports whether s can be sent as a quoted string (RFC 9051
// section 4.3: 7-bit, no CR, LF or NUL). Long strings go as literals so a
// client's line buffer is not strained.
func quotable(s string) bool {
	if len(s) > 1024 {
		return false
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; c == 0 || c == '\r' || c == '\n' || c >= 0x80 {
			return false
		}
	}
	return true
}

// str writes s as a quoted string or, when it cannot be quoted, a literal.
func (e *encoder) str(s string) *encoder {
	if !quotable(s) {
		e.raw("{").num64(uint64(len(s))).raw("}\r\n")
		return e.raw(s)
	}
	return e.quote(s)
}

// quote writes s as a quoted string; the caller has checked that it may be.
func (e *encoder) quote(s string) *encoder {
	e.raw(`"`)
	start := 0
	for i := 0; i < len(s); i++ {
		if s[i] == '"' || s[i] == '\\' {
			e.raw(s[start:i]).raw(`\`)
			start = i
		}
	}
	return e.raw(s[start:]).raw(`"`)
}

// astring writes s as an atom when it is one, else as str does.
func (e *encoder) astring(s string) *encoder {
	if s == "" || len(s) > 1024 || stringsEqualFoldNIL(s) {
		return e.str(s)
	}
	for i := 0; i < len(s); i++ {
		if !isAtomChar(s[i]) {
			return e.str(s)
		}
	}
	return e.raw(s)
}

// mailbox writes a stored (UTF-8) mailbox name as a session names it
// (utf7.go): in modified UTF-7 for IMAP4rev1, else in UTF-8, which
// IMAP4rev2 allows in quoted strings (RFC 9051 section 9, QUOTED-CHAR).
func (e *encoder) mailbox(name string, rev2 bool) *encoder {
	if !rev2 {
		return e.astring(encodeMUTF7(name))
	}
	if len(name) > 1024 || !utf8.ValidString(name) || strings.ContainsAny(name, "\x00\r\n") {
		return e.astring(name)
	}
	for i := 0; i < len(name); i++ {
		if name[i] >= 0x80 {
			return e.quote(name)
		}
	}
	return e.astring(name)
}

func stringsEqualFoldNIL(s string) bool {
	return len(s) == 3 && (s[0]|0x20) == 'n' && (s[1]|0x20) == 'i' && (s[2]|0x20) == 'l'
}

// nstring writes NIL for an absent value.
func (e *encoder) nstring(s string, ok bool) *encoder {
	if !ok {
		return e.raw("NIL")
	}
	return e.str(s)
}

// flags writes a parenthesized flag list.
func (e *encoder) flags(fs []string, recent bool) *encoder {
	e.raw("(")
	for i, f := range fs {
		if i > 0 {
			e.sp()
		}
		e.raw(f)
	}
	if recent {
		if len(fs) > 0 {
			e.sp()
		}
		e.raw(`\Recent`)
	}
	return e.raw(")")
}

// dateTime writes a date-time (RFC 9051 section 9): "dd-Mon-yyyy hh:mm:ss +zzzz".
func (e *encoder) dateTime(t time.Time) *encoder {
	b := append(e.scratch[:0], '"')
	b = t.AppendFormat(b, "_2-Jan-2006 15:04:05 -0700")
	b = append(b, '"')
	return e.bytes(b)
}
