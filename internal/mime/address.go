package mime

import "strings"

// maxAddresses bounds one address list.
const maxAddresses = 1000

// parseAddressList parses an RFC 5322 section 3.4 address-list, with the
// obsolete forms of section 4.4 (routes, empty list elements, CFWS between
// the dots of a local part), into ENVELOPE addresses. It never fails: an
// element it cannot read is skipped up to the next comma, a mailbox without
// a domain gets MissingDomain, and a plain addr-spec followed by a comment
// takes the comment as its display name ("user@host (Full Name)").
func parseAddressList(b []byte) []Address {
	s := string(trimWSP(b))
	if s == "" {
		return nil
	}
	p := addrParser{s: s}
	var out []Address
	for p.i < len(s) && len(out) < maxAddresses {
		p.skipSeparators()
		if p.i >= len(s) {
			break
		}
		before := p.i
		out = p.element(out, false)
		if p.i == before {
			p.i++ // a character no rule takes, such as a stray '>'
		}
	}
	return out
}

type addrParser struct {
	s       string
	i       int
	comment string // the last comment skipped, unparsed
}

// cfws skips white space and comments, remembering the last comment.
func (p *addrParser) cfws() {
	for p.i < len(p.s) {
		switch p.s[p.i] {
		case ' ', '\t', '\r', '\n':
			p.i++
		case '(':
			j := skipComment(p.s, p.i)
			p.comment = strings.TrimSpace(strings.TrimSuffix(p.s[p.i+1:j], ")"))
			p.i = j
		default:
			return
		}
	}
}

func (p *addrParser) skipSeparators() {
	for {
		p.cfws()
		if p.i < len(p.s) && p.s[p.i] == ',' {
			p.i++
			continue
		}
		return
	}
}

// word is an atom (dots included, as in obs-phrase) or a quoted-string.
type word struct {
	raw, text string
}

func isAtomChar(c byte) bool { return atomChars[c] }

// atomChars is atext (RFC 5322 section 3.2.3) widened to every octet
// above 0x7f, for the UTF-8 of RFC 6532.
var atomChars = charClass(`()<>@,;:\"[]`)

// words reads a phrase or a local part: words until a special, appended
// to ws.
func (p *addrParser) words(ws []word) []word {
	for {
		p.cfws()
		if p.i >= len(p.s) {
			return ws
		}
		switch c := p.s[p.i]; {
		case c == '"':
			start := p.i
			text, j := quoted(p.s, p.i)
			p.i = j
			ws = append(ws, word{raw: p.s[start:j], text: text})
		case isAtomChar(c):
			start := p.i
			for p.i < len(p.s) && isAtomChar(p.s[p.i]) {
				p.i++
			}
			ws = append(ws, word{raw: p.s[start:p.i], text: p.s[start:p.i]})
		default:
			return ws
		}
	}
}

func phrase(ws []word) string {
	if len(ws) == 1 {
		return collapseWSP(ws[0].text)
	}
	var b strings.Builder
	for i, w := range ws {
		if i > 0 {
			b.WriteByte(' ')
		}
		b.WriteString(w.text)
	}
	return collapseWSP(b.String())
}

func localPart(ws []word) string {
	if len(ws) == 1 {
		return ws[0].raw
	}
	var b strings.Builder
	for _, w := range ws {
		b.WriteString(w.raw)
	}
	return b.String()
}

// collapseWSP turns each run of white space into one space.
func collapseWSP(s string) string {
	if !strings.ContainsAny(s, "\t\r\n") && !strings.Contains(s, "  ") {
		return s
	}
	return strings.Join(strings.FieldsFunc(s, func(r rune) bool {
		return r == ' ' || r == '\t' || r == '\r' || r == '\n'
	}), " ")
}

// domain reads a domain: dot-atoms or a domain literal, with CFWS allowed
// around the dots (obs-domain).
func (p *addrParser) domain() string {
	var b strings.Builder
	// one is the only piece read so far, a substring of s: the common
	// case of one dot-atom, which then costs no copy.
	var one string
	add := func(piece string) {
		if b.Len() == 0 && one == "" {
			one = piece
			return
		}
		if one != "" {
			b.WriteString(one)
			one = ""
		}
		b.WriteString(piece)
	}
	for {
		p.cfws()
		if p.i >= len(p.s) {
			break
		}
		c := p.s[p.i]
		if c == '[' {
			j := strings.IndexByte(p.s[p.i:], ']')
			if j < 0 {
				j = len(p.s) - p.i - 1
			}
			add(p.s[p.i : p.i+j+1])
			p.i += j + 1
			continue
		}
		if !isAtomChar(c) {
			break
		}
		start := p.i
		for p.i < len(p.s) && isAtomChar(p.s[p.i]) {
			p.i++
		}
		add(p.s[start:p.i])
	}
	if one != "" {
		return one
	}
	return b.String()
}

func mailbox(name, route, local, host string) Address {
	if local == "" {
		local = MissingMailbox
	}
	if host == "" {
		host = MissingDomain
	}
	return Address{Name: name, Route: route, Mailbox: local, Host: host}
}

// element reads one address (a mailbox or a group) and appends it.
func (p *addrParser) element(out []Address, inGroup bool) []Address {
	p.comment = ""
	var buf [4]word
	ws := p.words(buf[:0])
	if p.i >= len(p.s) {
		if len(ws) > 0 {
			out = append(out, mailbox("", "", localPart(ws), ""))
		}
		return out
	}
	switch p.s[p.i] {
	case ':':
		p.i++
		if inGroup {
			// RFC 5322 forbids nested groups: read the inner one's members
			// as this group's.
			return out
		}
		name := phrase(ws)
		if name != "" {
			out = append(out, Address{Mailbox: name})
		}
		for p.i < len(p.s) && len(out) < maxAddresses {
			p.skipSeparators()
			if p.i >= len(p.s) {
				break
			}
			if p.s[p.i] == ';' {
				p.i++
				break
			}
			before := p.i
			out = p.element(out, true)
			if p.i == before {
				p.i++
			}
		}
		if name != "" {
			out = append(out, Address{})
		}
		return out
	case '<':
		p.i++
		name := phrase(ws)
		route := p.route()
		local := localPart(p.words(ws[:0]))
		var host string
		if p.i < len(p.s) && p.s[p.i] == '@' {
			p.i++
			host = p.domain()
		}
		p.cfws()
		if j := strings.IndexByte(p.s[p.i:], '>'); j >= 0 {
			p.i += j + 1
		} else {
			p.i = len(p.s)
		}
		if local == "" && host == "" && name == "" {
			return out // "<>": no address
		}
		return append(out, mailbox(name, route, local, host))
	case '@':
		p.i++
		p.comment = ""
		host := p.domain()
		p.cfws()
		name := ""
		if p.comment != "" {
			name = collapseWSP(p.comment)
		}
		return append(out, mailbox(name, "", localPart(ws), host))
	default:
		// ',' ';' '>' or junk: a bare word is a local part without a domain.
		if len(ws) > 0 {
			out = append(out, mailbox("", "", localPart(ws), ""))
		}
		if c := p.s[p.i]; c != ',' && c != ';' {
			if j := strings.IndexAny(p.s[p.i:], ",;"); j >= 0 {
				p.i += j
			} else {
				p.i = len(p.s)
			}
		}
		return out
	}
}

// route reads an obsolete source route "@a,@b:" (RFC 5322 section 4.4).
func (p *addrParser) route() string {
	p.cfws()
	if p.i >= len(p.s) || p.s[p.i] != '@' {
		return ""
	}
	j := strings.IndexByte(p.s[p.i:], ':')
	if j < 0 {
		return ""
	}
	r := p.s[p.i : p.i+j]
	p.i += j + 1
	return strings.Map(func(c rune) rune {
		if c == ' ' || c == '\t' || c == '\r' || c == '\n' {
			return -1
		}
		return c
	}, r)
}

// parseMsgIDs returns up to max msg-ids ("<...>", RFC 5322 section 3.6.4)
// of a field, skipping phrases and comments (obs-in-reply-to).
func parseMsgIDs(s string, max int) []string {
	var ids []string
	for i := 0; i < len(s) && len(ids) < max; {
		i = skipCFWS(s, i)
		if i >= len(s) {
			break
		}
		switch s[i] {
		case '<':
			j := strings.IndexByte(s[i:], '>')
			if j < 0 {
				return ids
			}
			id := s[i : i+j+1]
			if strings.ContainsAny(id, " \t\r\n") {
				id = strings.Map(func(c rune) rune {
					if c == ' ' || c == '\t' || c == '\r' || c == '\n' {
						return -1
					}
					return c
				}, id)
			}
			if len(id) > 2 {
				ids = append(ids, id)
			}
			i += j + 1
		case '"':
			_, i = quoted(s, i)
		default:
			i++
		}
	}
	return ids
}
