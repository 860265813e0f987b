package mime

import (
	"bytes"
	"strings"
)

// The header fields a summary keeps. Of a repeated field, the first
// occurrence counts, as in Dovecot and Cyrus.
type fieldID int8

const (
	fContentType fieldID = iota
	fEncoding
	fID
	fDescription
	fDisposition
	fLanguage
	fLocation
	fMD5
	numMIMEFields
	// Fields of message entities only (the message and encapsulated ones).
	fDate fieldID = iota - 1
	fSubject
	fFrom
	fSender
	fReplyTo
	fTo
	fCc
	fBcc
	fInReplyTo
	fMessageID
	fReferences
	numFields
	fNone fieldID = -1
)

var fieldNames = [numFields]string{
	"content-type", "content-transfer-encoding", "content-id", "content-description",
	"content-disposition", "content-language", "content-location", "content-md5",
	"date", "subject", "from", "sender", "reply-to", "to", "cc", "bcc",
	"in-reply-to", "message-id", "references",
}

// headerCollector keeps the values of the fields of one header, unfolded
// (RFC 5322 section 2.2.3) and bounded by MaxFieldLen. Its buffers are
// reused from one entity to the next.
type headerCollector struct {
	message   bool
	vals      [numFields][]byte
	seen      uint32
	cur       fieldID
	truncated bool
}

func (h *headerCollector) reset(message bool) {
	h.message, h.seen, h.cur, h.truncated = message, 0, fNone, false
	for i := range h.vals {
		h.vals[i] = h.vals[i][:0]
	}
}

func lookupField(name []byte, message bool) fieldID {
	n := fieldID(numMIMEFields)
	if message {
		n = numFields
	}
	for i := fieldID(0); i < n; i++ {
		if len(fieldNames[i]) == len(name) && bytes.EqualFold(name, []byte(fieldNames[i])) {
			return i
		}
	}
	return fNone
}

func (h *headerCollector) field(name, value []byte) {
	h.cur = fNone
	id := lookupField(name, h.message)
	if id == fNone || h.seen&(1<<id) != 0 {
		return
	}
	h.seen |= 1 << id
	h.cur = id
	h.add(value)
}

func (h *headerCollector) continued(line []byte) {
	if h.cur != fNone {
		h.add(line)
	}
}

// add appends to the current field, dropping NULs (which no IMAP string
// may carry) and whatever exceeds MaxFieldLen.
func (h *headerCollector) add(b []byte) {
	v := h.vals[h.cur]
	for len(b) > 0 {
		i := bytes.IndexByte(b, 0)
		seg := b
		if i >= 0 {
			seg, b = b[:i], b[i+1:]
		} else {
			b = nil
		}
		if room := MaxFieldLen - len(v); len(seg) > room {
			seg = seg[:room]
			h.truncated = true
		}
		v = append(v, seg...)
	}
	h.vals[h.cur] = v
}

func (h *headerCollector) value(id fieldID) string {
	return string(trimWSP(h.vals[id]))
}

func (h *headerCollector) has(id fieldID) bool { return h.seen&(1<<id) != 0 }

func trimWSP(b []byte) []byte {
	isWSP := func(c byte) bool { return c == ' ' || c == '\t' || c == '\r' || c == '\n' }
	for len(b) > 0 && isWSP(b[0]) {
		b = b[1:]
	}
	for len(b) > 0 && isWSP(b[len(b)-1]) {
		b = b[:len(b)-1]
	}
	return b
}

// apply sets part's MIME fields from the header (RFC 2045, 2183, 3066,
// 2557, 1864).
func (h *headerCollector) apply(part *Part) Anomaly {
	var an Anomaly
	if h.truncated {
		an |= AnomalyHeader
	}
	typ, sub, params, ok := "", "", []Param(nil), false
	if h.has(fContentType) {
		typ, sub, params, ok = parseContentType(h.value(fContentType))
		if !ok {
			an |= AnomalyContentType
		}
	}
	if ok {
		part.Type, part.Subtype, part.Params = typ, sub, params
	} else {
		part.Type, part.Subtype, part.defaultType = "text", "plain", true
	}
	part.Encoding = lower(firstToken(h.value(fEncoding)))
	part.ID = h.value(fID)
	part.Description = h.value(fDescription)
	part.MD5 = h.value(fMD5)
	part.Location = h.value(fLocation)
	if h.has(fDisposition) {
		if d, dp, ok := parseDisposition(h.value(fDisposition)); ok {
			part.Disposition, part.DispositionParams = d, dp
		}
	}
	if h.has(fLanguage) {
		part.Language = parseLanguage(h.value(fLanguage))
	}
	return an
}

// envelope fills env from a message entity's header.
func (h *headerCollector) envelope(env *Envelope) {
	env.Date = h.value(fDate)
	env.Subject = h.value(fSubject)
	env.From = parseAddressList(h.vals[fFrom])
	env.Sender = parseAddressList(h.vals[fSender])
	env.ReplyTo = parseAddressList(h.vals[fReplyTo])
	env.To = parseAddressList(h.vals[fTo])
	env.Cc = parseAddressList(h.vals[fCc])
	env.Bcc = parseAddressList(h.vals[fBcc])
	env.InReplyTo = h.value(fInReplyTo)
	env.MessageID = h.value(fMessageID)
}

// sortKeys fills the SORT and THREAD keys of the top-level message.
func (h *headerCollector) sortKeys(s *Summary) {
	if t, ok := parseDate(s.Envelope.Date); ok {
		_, off := t.Zone()
		s.Date, s.DateZone, s.HasDate = t.Unix(), int16(off/60), true
	}
	s.BaseSubject, s.IsReplyOrForward = BaseSubject(s.Envelope.Subject)
	s.References = parseMsgIDs(string(h.vals[fReferences]), maxReferences)
	for f := From; f <= Cc; f++ {
		if a, ok := firstMailbox(s.list(f)); ok && a.Name != "" {
			if d := decodeWords(a.Name); d != a.Name {
				s.display[f] = d
			}
		}
	}
}

// maxReferences bounds the References kept; RFC 5322 section 3.6.4 lets a
// writer trim the list too.
const maxReferences = 100

// Tokens of MIME structured fields (RFC 2045 section 5.1). Parsing is
// lenient: 8-bit octets are token characters, an unquoted parameter value
// runs to the next ";" or white space (real mail has boundary=----=_Part
// unquoted), and anything unparseable is skipped.

func isTokenChar(c byte) bool { return tokenChars[c] }

// tokenChars is RFC 2045 section 5.1's token, widened to every octet above
// 0x7f as the address parser's atoms are.
var tokenChars = charClass(`()<>@,;:\"/[]?=`)

// charClass returns the octets that are neither controls, space, DEL nor
// one of specials: a table, since the header parsers test every octet.
func charClass(specials string) (t [256]bool) {
	for c := '!'; c < 0x100; c++ {
		t[c] = c != 0x7f && !strings.ContainsRune(specials, c)
	}
	return t
}

// skipCFWS skips white space and (nested) comments.
func skipCFWS(s string, i int) int {
	for i < len(s) {
		switch s[i] {
		case ' ', '\t', '\r', '\n':
			i++
		case '(':
			i = skipComment(s, i)
		default:
			return i
		}
	}
	return i
}

// skipComment returns the index after the comment at s[i] == '('.
func skipComment(s string, i int) int {
	depth := 0
	for ; i < len(s); i++ {
		switch s[i] {
		case '\\':
			i++
		case '(':
			depth++
		case ')':
			depth--
			if depth == 0 {
				return i + 1
			}
		}
	}
	return len(s)
}

func token(s string, i int) (string, int) {
	j := i
	for j < len(s) && isTokenChar(s[j]) {
		j++
	}
	return s[i:j], j
}

func firstToken(s string) string {
	t, _ := token(s, skipCFWS(s, 0))
	return t
}

// quoted reads the quoted-string at s[i] == '"', unescaping quoted pairs;
// an unterminated one runs to the end.
func quoted(s string, i int) (string, int) {
	var b strings.Builder
	for i++; i < len(s); i++ {
		switch c := s[i]; c {
		case '"':
			return b.String(), i + 1
		case '\\':
			if i+1 < len(s) {
				i++
				b.WriteByte(s[i])
			}
		case '\r', '\n':
		default:
			b.WriteByte(c)
		}
	}
	return b.String(), i
}

// parseContentType parses RFC 2045 section 5.1 type "/" subtype *(";"
// parameter); ok is false when type or subtype is missing.
func parseContentType(v string) (typ, sub string, params []Param, ok bool) {
	i := skipCFWS(v, 0)
	typ, i = token(v, i)
	i = skipCFWS(v, i)
	if typ == "" || i >= len(v) || v[i] != '/' {
		return "", "", nil, false
	}
	i = skipCFWS(v, i+1)
	sub, i = token(v, i)
	if sub == "" {
		return "", "", nil, false
	}
	return lower(typ), lower(sub), parseParams(v, i), true
}

// parseDisposition parses RFC 2183 disposition-type *(";" parameter).
func parseDisposition(v string) (string, []Param, bool) {
	typ, i := token(v, skipCFWS(v, 0))
	if typ == "" {
		return "", nil, false
	}
	return lower(typ), parseParams(v, i), true
}

func parseParams(v string, i int) []Param {
	var params []Param
	for len(params) < maxParams {
		i = skipCFWS(v, i)
		if i >= len(v) {
			break
		}
		if v[i] != ';' {
			// Junk between parameters: skip to the next one.
			j := strings.IndexByte(v[i:], ';')
			if j < 0 {
				break
			}
			i += j
		}
		i = skipCFWS(v, i+1)
		var name string
		name, i = token(v, i)
		i = skipCFWS(v, i)
		if name == "" || i >= len(v) || v[i] != '=' {
			continue
		}
		i = skipCFWS(v, i+1)
		var val string
		if i < len(v) && v[i] == '"' {
			val, i = quoted(v, i)
		} else {
			j := i
			for j < len(v) && v[j] != ';' && v[j] != ' ' && v[j] != '\t' && v[j] != '\r' && v[j] != '\n' {
				j++
			}
			val, i = v[i:j], j
		}
		params = append(params, Param{Name: lower(name), Value: val})
	}
	return params
}

// parseLanguage parses RFC 3282 Language-List: tags separated by commas.
func parseLanguage(v string) []string {
	var tags []string
	for i := 0; i < len(v) && len(tags) < maxParams; {
		i = skipCFWS(v, i)
		var t string
		t, i = token(v, i)
		if t != "" {
			tags = append(tags, t)
		}
		if i < len(v) && !isTokenChar(v[i]) && v[i] != '(' {
			i++
		}
	}
	return tags
}
