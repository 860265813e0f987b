package mime

import (
	"fmt"
	"io"
	stdmime "mime"
	"net/mail"
	"strings"
	"time"

	"golang.org/x/text/encoding/htmlindex"
)

// charsetReader decodes any charset the WHATWG encoding index knows.
func charsetReader(charset string, r io.Reader) (io.Reader, error) {
	enc, err := htmlindex.Get(charset)
	if err != nil {
		return nil, fmt.Errorf("mime: unknown charset %q: %w", charset, err)
	}
	return enc.NewDecoder().Reader(r), nil
}

// decodeWords decodes the encoded words of a header value; a value it
// cannot decode is returned unchanged.
func decodeWords(s string) string {
	if !strings.Contains(s, "=?") {
		return s
	}
	wd := stdmime.WordDecoder{CharsetReader: charsetReader}
	d, err := wd.DecodeHeader(s)
	if err != nil {
		return s
	}
	return d
}

// parseDate parses an RFC 5322 section 3.3 date-time, obsolete forms
// included. It accepts exactly what mail.ParseDate accepts; the result has
// the same Unix time and zone offset, though not necessarily the same
// Location.
func parseDate(s string) (time.Time, bool) {
	if t, ok := parseDateFast(s); ok {
		return t, true
	}
	if s == "" {
		return time.Time{}, false
	}
	t, err := mail.ParseDate(s)
	if err != nil {
		return time.Time{}, false
	}
	return t, true
}

// parseDateFast parses the common RFC 5322 section 3.3
// date-time form
//
//	[day-name ", "] 1*2DIGIT " " month " " 4DIGIT " " 2DIGIT ":" 2DIGIT [":" 2DIGIT] " " ("+" / "-") 4DIGIT [" (" comment ")"]
//
// with single spaces, names in their RFC 5322 case, no folding and a
// comment without nested comments or quoted-pairs. It reports false for
// anything else, including values out of range, leaving those to
// mail.ParseDate; whatever it accepts, mail.ParseDate accepts with the same
// Unix time and zone offset. Like mail.ParseDate it does not check the
// day-name against the date. It allocates nothing for whole-hour zones
// (time.FixedZone's cache) where mail.ParseDate, trying its layouts in
// turn, allocates a failed parse's error for each of the 24 layouts before
// the common form's.
func parseDateFast(s string) (time.Time, bool) {
	i := 0
	if len(s) >= 5 && s[3] == ',' && s[4] == ' ' {
		if nameIndex(dayNames, s[:3]) < 0 {
			return time.Time{}, false
		}
		i = 5
	}
	n := 1
	if len(s) > i+1 && isDigit(s[i+1]) {
		n = 2
	}
	day, ok := digits(s, i, n)
	i += n
	if !ok || !hasByte(s, i, ' ') || len(s) < i+4 {
		return time.Time{}, false
	}
	month := nameIndex(monthNames, s[i+1:i+4]) + 1
	i += 4
	if month == 0 || !hasByte(s, i, ' ') {
		return time.Time{}, false
	}
	year, ok := digits(s, i+1, 4)
	i += 5
	if !ok || !hasByte(s, i, ' ') {
		return time.Time{}, false
	}
	hour, ok1 := digits(s, i+1, 2)
	minute, ok2 := digits(s, i+4, 2)
	if !ok1 || !ok2 || !hasByte(s, i+3, ':') {
		return time.Time{}, false
	}
	i += 6
	sec := 0
	if hasByte(s, i, ':') {
		if sec, ok = digits(s, i+1, 2); !ok {
			return time.Time{}, false
		}
		i += 3
	}
	if !hasByte(s, i, ' ') || len(s) < i+2 || (s[i+1] != '+' && s[i+1] != '-') {
		return time.Time{}, false
	}
	zh, ok1 := digits(s, i+2, 2)
	zm, ok2 := digits(s, i+4, 2)
	if !ok1 || !ok2 || !isComment(s[i+6:]) {
		return time.Time{}, false
	}
	// time.Parse accepts zone offsets up to 24:60; only real ones are taken
	// here.
	if day < 1 || day > daysIn(month, year) || hour > 23 || minute > 59 || sec > 59 || zh > 23 || zm > 59 {
		return time.Time{}, false
	}
	off := (zh*60 + zm) * 60
	if s[i+1] == '-' {
		off = -off
	}
	unix := time.Date(year, time.Month(month), day, hour, minute, sec, 0, time.UTC).Unix() - int64(off)
	return time.Unix(unix, 0).In(time.FixedZone("", off)), true
}

const (
	dayNames   = "MonTueWedThuFriSatSun"
	monthNames = "JanFebMarAprMayJunJulAugSepOctNovDec"
)

// nameIndex returns the index of the three-letter name in names, or -1.
func nameIndex(names, name string) int {
	for i := 0; i+3 <= len(names); i += 3 {
		if names[i:i+3] == name {
			return i / 3
		}
	}
	return -1
}

func isDigit(c byte) bool { return '0' <= c && c <= '9' }

func hasByte(s string, i int, c byte) bool { return i < len(s) && s[i] == c }

// digits parses the n decimal digits at s[i:].
func digits(s string, i, n int) (int, bool) {
	if i+n > len(s) {
		return 0, false
	}
	v := 0
	for _, c := range []byte(s[i : i+n]) {
		if !isDigit(c) {
			return 0, false
		}
		v = v*10 + int(c-'0')
	}
	return v, true
}

// isComment reports whether s is empty or a space and a comment (RFC 5322
// section 3.2.2) of ctext, white space and 8-bit octets only: no nested
// comment, quoted-pair or control character, CR and LF included.
func isComment(s string) bool {
	if s == "" {
		return true
	}
	if len(s) < 3 || s[0] != ' ' || s[1] != '(' || s[len(s)-1] != ')' {
		return false
	}
	for _, c := range []byte(s[2 : len(s)-1]) {
		if c == '(' || c == ')' || c == '\\' || (c < ' ' && c != '\t') || c == 0x7f {
			return false
		}
	}
	return true
}

func daysIn(month, year int) int {
	switch month {
	case 2:
		if year%4 == 0 && (year%100 != 0 || year%400 == 0) {
			return 29
		}
		return 28
	case 4, 6, 9, 11:
		return 30
	}
	return 31
}

// BaseSubject extracts the RFC 5256 section 2.1 base subject of a raw
// Subject value, for SORT SUBJECT and THREAD=ORDEREDSUBJECT. isReplyOrFwd
// reports whether a reply or forward marker was removed (section 2.1,
// "is-reply-or-fwd"). The result is not case-folded.
func BaseSubject(raw string) (base string, isReplyOrFwd bool) {
	// (1) Decode encoded words; tabs and line breaks become spaces, runs of
	// spaces one space.
	s := collapseWSP(strings.ReplaceAll(decodeWords(raw), "\t", " "))
	for {
		// (2) Remove trailing subj-trailer: "(fwd)" or white space.
		for {
			t := strings.TrimRight(s, " ")
			if len(t) >= 5 && strings.EqualFold(t[len(t)-5:], "(fwd)") {
				t = t[:len(t)-5]
				isReplyOrFwd = true
			}
			if t == s {
				break
			}
			s = t
		}
		// (3)-(5) Remove subj-leader and subj-blob prefixes until none is
		// left.
		for {
			t := strings.TrimLeft(s, " ")
			if rest, ok := cutRefwd(t); ok {
				t = rest
				isReplyOrFwd = true
			}
			if rest, ok := cutBlob(t); ok && strings.TrimLeft(rest, " ") != "" {
				t = rest
			}
			if t == s {
				break
			}
			s = t
		}
		// (6) "[fwd:" ... "]" wraps a forwarded subject.
		if len(s) >= 6 && strings.EqualFold(s[:5], "[fwd:") && s[len(s)-1] == ']' {
			s = s[5 : len(s)-1]
			isReplyOrFwd = true
			continue
		}
		return s, isReplyOrFwd
	}
}

// cutBlob removes a leading subj-blob: "[" *BLOBCHAR "]" *WSP.
func cutBlob(s string) (string, bool) {
	if len(s) == 0 || s[0] != '[' {
		return s, false
	}
	j := strings.IndexAny(s[1:], "[]")
	if j < 0 || s[1+j] != ']' {
		return s, false
	}
	return strings.TrimLeft(s[j+2:], " "), true
}

// cutRefwd removes a leading *subj-blob subj-refwd, where subj-refwd is
// ("re" / ("fw" ["d"])) *WSP [subj-blob] ":".
func cutRefwd(s string) (string, bool) {
	t := s
	for {
		rest, ok := cutBlob(t)
		if !ok {
			break
		}
		t = rest
	}
	switch {
	case len(t) >= 3 && strings.EqualFold(t[:3], "fwd"):
		t = t[3:]
	case len(t) >= 2 && (strings.EqualFold(t[:2], "re") || strings.EqualFold(t[:2], "fw")):
		t = t[2:]
	default:
		return s, false
	}
	t = strings.TrimLeft(t, " ")
	if rest, ok := cutBlob(t); ok {
		t = rest
	}
	if len(t) == 0 || t[0] != ':' {
		return s, false
	}
	return t[1:], true
}
