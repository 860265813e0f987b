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
// included.
func parseDate(s string) (time.Time, bool) {
	if s == "" {
		return time.Time{}, false
	}
	t, err := mail.ParseDate(s)
	if err != nil {
		return time.Time{}, false
	}
	return t, true
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
