package loadgen

import (
	"bytes"
	"fmt"
	"strconv"
	"strings"
)

// FetchItems is what one FETCH response (RFC 9051 section 7.5.2) carried of
// the items a checking client asks for. Body aliases the response.
type FetchItems struct {
	Seq      uint32
	UID      uint32 // 0 when absent
	Flags    []string
	HasFlags bool
	ModSeq   uint64 // 0 when absent (RFC 7162)
	Body     []byte // the first BODY[...] item's value
	HasBody  bool
}

// maxUIDSet bounds how many UIDs ParseUIDSet expands.
const maxUIDSet = 1 << 16

// ParseFetch parses r as "* n FETCH (item value ...)". ok is false for a
// response that is not a FETCH; a FETCH it cannot parse is an error.
// Items other than UID, FLAGS, MODSEQ and BODY[...] are skipped.
func ParseFetch(r *IMAPResponse) (it FetchItems, ok bool, err error) {
	if len(r.Lines) == 0 || len(r.Literals) >= len(r.Lines)+1 {
		return it, false, nil
	}
	f := bytes.SplitN(r.Lines[0], []byte(" "), 4)
	if len(f) < 4 || string(f[0]) != "*" || !bytes.EqualFold(f[2], []byte("FETCH")) {
		return it, false, nil
	}
	seq, err := strconv.ParseUint(string(f[1]), 10, 32)
	if err != nil || seq == 0 {
		return it, false, fmt.Errorf("%w: FETCH with sequence number %q", ErrProtocol, f[1])
	}
	it.Seq = uint32(seq)
	// One buffer: the lines with each literal's announcement replaced
	// by a NUL that stands for it.
	var b []byte
	for i, line := range r.Lines {
		if i < len(r.Literals) {
			open := bytes.LastIndexByte(line, '{')
			if open < 0 {
				return it, false, fmt.Errorf("%w: literal without announcement in %q", ErrProtocol, line)
			}
			line = bytes.TrimSuffix(line[:open], []byte("~"))
			b = append(b, line...)
			b = append(b, 0)
			continue
		}
		b = append(b, line...)
	}
	s := &itemScanner{b: b, lits: r.Literals}
	s.pos = len(f[0]) + 1 + len(f[1]) + 1 + len(f[2]) + 1
	if !s.eat('(') {
		return it, false, fmt.Errorf("%w: FETCH without item list: %q", ErrProtocol, r.Lines[0])
	}
	for {
		s.spaces()
		if s.eat(')') {
			return it, true, nil
		}
		name := s.itemName()
		if name == "" {
			return it, false, fmt.Errorf("%w: FETCH item expected at %d in %q", ErrProtocol, s.pos, r.Lines[0])
		}
		s.spaces()
		start := s.pos
		lit, err := s.value(0)
		if err != nil {
			return it, false, err
		}
		raw := s.b[start:s.pos]
		up := strings.ToUpper(name)
		switch {
		case up == "UID":
			v, err := strconv.ParseUint(string(raw), 10, 32)
			if err != nil {
				return it, false, fmt.Errorf("%w: UID %q", ErrProtocol, raw)
			}
			it.UID = uint32(v)
		case up == "MODSEQ":
			v, err := strconv.ParseUint(string(bytes.Trim(raw, "()")), 10, 63)
			if err != nil {
				return it, false, fmt.Errorf("%w: MODSEQ %q", ErrProtocol, raw)
			}
			it.ModSeq = v
		case up == "FLAGS":
			inner, ok := bytes.CutPrefix(raw, []byte("("))
			inner, ok2 := bytes.CutSuffix(inner, []byte(")"))
			if !ok || !ok2 {
				return it, false, fmt.Errorf("%w: FLAGS %q", ErrProtocol, raw)
			}
			it.Flags = it.Flags[:0]
			for _, fl := range bytes.Fields(inner) {
				it.Flags = append(it.Flags, string(fl))
			}
			it.HasFlags = true
		case strings.HasPrefix(up, "BODY[") && !it.HasBody:
			switch {
			case lit >= 0:
				it.Body, it.HasBody = r.Literals[lit], true
			case len(raw) >= 2 && raw[0] == '"':
				it.Body, it.HasBody = unquote(raw), true
			}
		}
	}
}

type itemScanner struct {
	b    []byte
	lits [][]byte
	pos  int
	lit  int // the next literal's index
}

func (s *itemScanner) eat(c byte) bool {
	if s.pos < len(s.b) && s.b[s.pos] == c {
		s.pos++
		return true
	}
	return false
}

func (s *itemScanner) spaces() {
	for s.pos < len(s.b) && s.b[s.pos] == ' ' {
		s.pos++
	}
}

// itemName reads a data item name: an atom, with a section "[...]" and a
// partial "<...>" as BODY[...]<n> has them.
func (s *itemScanner) itemName() string {
	start := s.pos
	for s.pos < len(s.b) {
		switch c := s.b[s.pos]; {
		case c == '[':
			end := bytes.IndexByte(s.b[s.pos:], ']')
			if end < 0 {
				return ""
			}
			s.pos += end + 1
			if s.pos < len(s.b) && s.b[s.pos] == '<' {
				end := bytes.IndexByte(s.b[s.pos:], '>')
				if end < 0 {
					return ""
				}
				s.pos += end + 1
			}
			return string(s.b[start:s.pos])
		case c == ' ' || c == '(' || c == ')' || c == '"' || c == 0:
			return string(s.b[start:s.pos])
		}
		s.pos++
	}
	return string(s.b[start:s.pos])
}

// value skips one value: an atom or number, a quoted string, a literal or
// a parenthesized list of values, nested at most 64 deep. It returns the
// literal's index when the value is one literal, else -1.
func (s *itemScanner) value(depth int) (int, error) {
	if s.pos >= len(s.b) {
		return -1, fmt.Errorf("%w: FETCH value missing", ErrProtocol)
	}
	switch s.b[s.pos] {
	case 0:
		s.pos++
		s.lit++
		if s.lit > len(s.lits) {
			return -1, fmt.Errorf("%w: FETCH literal missing", ErrProtocol)
		}
		return s.lit - 1, nil
	case '"':
		s.pos++
		for s.pos < len(s.b) {
			switch s.b[s.pos] {
			case '\\':
				s.pos += 2
				continue
			case '"':
				s.pos++
				return -1, nil
			}
			s.pos++
		}
		return -1, fmt.Errorf("%w: unterminated quoted string", ErrProtocol)
	case '(':
		if depth == 64 {
			return -1, fmt.Errorf("%w: list nested too deep", ErrProtocol)
		}
		s.pos++
		for {
			s.spaces()
			if s.pos >= len(s.b) {
				return -1, fmt.Errorf("%w: unterminated list", ErrProtocol)
			}
			if s.eat(')') {
				return -1, nil
			}
			if _, err := s.value(depth + 1); err != nil {
				return -1, err
			}
		}
	}
	start := s.pos
	for s.pos < len(s.b) {
		c := s.b[s.pos]
		if c == ' ' || c == ')' || c == '(' || c == 0 || c == '"' {
			break
		}
		s.pos++
	}
	if s.pos == start {
		return -1, fmt.Errorf("%w: unexpected %q in FETCH", ErrProtocol, s.b[s.pos])
	}
	return -1, nil
}

func unquote(raw []byte) []byte {
	raw = raw[1 : len(raw)-1]
	var out []byte
	for i := 0; i < len(raw); i++ {
		if raw[i] == '\\' && i+1 < len(raw) {
			i++
		}
		out = append(out, raw[i])
	}
	return out
}

// ResponseCode returns the response code a status text starts with
// ("[APPENDUID 7 3] APPEND completed" gives "APPENDUID" and ["7" "3"]),
// the name in upper case; ok is false when there is none.
func ResponseCode(text string) (name string, args []string, ok bool) {
	rest, found := strings.CutPrefix(text, "[")
	if !found {
		return "", nil, false
	}
	inner, _, found := strings.Cut(rest, "]")
	if !found {
		return "", nil, false
	}
	f := strings.Fields(inner)
	if len(f) == 0 {
		return "", nil, false
	}
	return strings.ToUpper(f[0]), f[1:], true
}

// ParseUIDSet expands a sequence set of UIDs ("3:5,9", RFC 9051 section
// 9, without "*") in the order written, ranges in the order their ends
// are written (RFC 4315's COPYUID pairs its two sets by position). It
// refuses sets of more than 65,536 UIDs.
func ParseUIDSet(s string) ([]uint32, error) {
	var out []uint32
	for _, part := range strings.Split(s, ",") {
		lo, hi, isRange := strings.Cut(part, ":")
		a, err := strconv.ParseUint(lo, 10, 32)
		if err != nil || a == 0 {
			return nil, fmt.Errorf("%w: UID set %q", ErrProtocol, s)
		}
		b := a
		if isRange {
			if b, err = strconv.ParseUint(hi, 10, 32); err != nil || b == 0 {
				return nil, fmt.Errorf("%w: UID set %q", ErrProtocol, s)
			}
		}
		step := int64(1)
		if b < a {
			step = -1
		}
		for v := int64(a); ; v += step {
			if len(out) == maxUIDSet {
				return nil, fmt.Errorf("%w: UID set %q larger than %d", ErrProtocol, s, maxUIDSet)
			}
			out = append(out, uint32(v))
			if v == int64(b) {
				break
			}
		}
	}
	return out, nil
}
