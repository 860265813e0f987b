package imap

import (
	"context"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	"quill/internal/mailbox"
	"quill/internal/mime"
)

// searchKey is one search-key (RFC 3501 section 6.4.4); and/or/not build
// the tree.
type searchKey struct {
	op    string // ALL, FLAG, UNFLAG, LARGER, SMALLER, BEFORE, ON, SINCE, SENTBEFORE, SENTON, SENTSINCE, HEADER, BODY, TEXT, UID, SEQ, NOT, OR, AND, NEW, OLD, RECENT
	flag  string
	n     int64
	date  time.Time
	field string // HEADER field name (FROM, TO, ... map to HEADER)
	value string
	set   SeqSet
	sub   []searchKey
}

// maxSearchKeys bounds the keys of one SEARCH.
const maxSearchKeys = 1000

type searchParser struct {
	d     *decoder
	count int
	// modseq records a MODSEQ key (RFC 7162 section 3.1.5), whose
	// results carry the highest MODSEQ of the messages found.
	modseq bool
}

// keys reads search keys separated by SP until the end of the command or
// a ')'.
func (p *searchParser) keys() ([]searchKey, error) {
	var out []searchKey
	for {
		k, err := p.key()
		if err != nil {
			return nil, err
		}
		out = append(out, k)
		if p.d.eol() || p.d.peek() == ')' {
			return out, nil
		}
		if err := p.d.sp(); err != nil {
			return nil, err
		}
	}
}

func (p *searchParser) key() (searchKey, error) {
	d := p.d
	p.count++
	if p.count > maxSearchKeys {
		return searchKey{}, &protoError{code: "LIMIT", text: "too many search keys"}
	}
	if d.peek() == '(' {
		var sub []searchKey
		d.depth++
		defer func() { d.depth-- }()
		if d.depth > maxDepth {
			return searchKey{}, &protoError{code: "LIMIT", text: "search keys nested too deeply"}
		}
		d.accept('(')
		sub, err := p.keys()
		if err != nil {
			return searchKey{}, err
		}
		if err := d.expect(')'); err != nil {
			return searchKey{}, err
		}
		return searchKey{op: "AND", sub: sub}, nil
	}
	if c := d.peek(); c == '$' || c == '*' || (c >= '0' && c <= '9') {
		set, err := d.seqSet()
		return searchKey{op: "SEQ", set: set}, err
	}
	a, err := d.atom("")
	if err != nil {
		return searchKey{}, err
	}
	a = strings.ToUpper(a)
	arg := func() (string, error) {
		if err := d.sp(); err != nil {
			return "", err
		}
		return d.astring()
	}
	dateArg := func(op string) (searchKey, error) {
		if err := d.sp(); err != nil {
			return searchKey{}, err
		}
		t, err := d.date()
		return searchKey{op: op, date: t}, err
	}
	flagKey := func(op, flag string) (searchKey, error) { return searchKey{op: op, flag: flag}, nil }
	switch a {
	case "ALL":
		return searchKey{op: "ALL"}, nil
	case "ANSWERED", "DELETED", "DRAFT", "FLAGGED", "SEEN":
		return flagKey("FLAG", canonicalFlag(`\`+a))
	case "UNANSWERED", "UNDELETED", "UNDRAFT", "UNFLAGGED", "UNSEEN":
		return flagKey("UNFLAG", canonicalFlag(`\`+a[2:]))
	case "NEW", "OLD", "RECENT":
		return searchKey{op: a}, nil
	case "KEYWORD", "UNKEYWORD":
		if err := d.sp(); err != nil {
			return searchKey{}, err
		}
		f, err := d.flag()
		if a == "KEYWORD" {
			return searchKey{op: "FLAG", flag: f}, err
		}
		return searchKey{op: "UNFLAG", flag: f}, err
	case "BCC", "CC", "FROM", "SUBJECT", "TO":
		v, err := arg()
		return searchKey{op: "HEADER", field: a, value: v}, err
	case "HEADER":
		f, err := arg()
		if err != nil {
			return searchKey{}, err
		}
		v, err := arg()
		return searchKey{op: "HEADER", field: strings.ToUpper(f), value: v}, err
	case "BODY", "TEXT":
		v, err := arg()
		return searchKey{op: a, value: v}, err
	case "BEFORE", "ON", "SINCE", "SENTBEFORE", "SENTON", "SENTSINCE":
		return dateArg(a)
	case "LARGER", "SMALLER":
		if err := d.sp(); err != nil {
			return searchKey{}, err
		}
		n, err := d.number64()
		return searchKey{op: a, n: int64(n)}, err
	case "UID":
		if err := d.sp(); err != nil {
			return searchKey{}, err
		}
		set, err := d.seqSet()
		return searchKey{op: "UID", set: set}, err
	case "MODSEQ":
		// MODSEQ [entry-name SP entry-type-req] SP mod-sequence-valzer;
		// MODSEQs are per message here, so the entry only parses.
		if err := d.sp(); err != nil {
			return searchKey{}, err
		}
		if d.peek() == '"' {
			if _, err := d.quoted(); err != nil {
				return searchKey{}, err
			}
			if err := d.sp(); err != nil {
				return searchKey{}, err
			}
			t, err := d.atom("")
			if err != nil {
				return searchKey{}, err
			}
			switch strings.ToLower(t) {
			case "priv", "shared", "all":
			default:
				return searchKey{}, syntaxErr("bad entry type")
			}
			if err := d.sp(); err != nil {
				return searchKey{}, err
			}
		}
		n, err := d.modSeq(true)
		p.modseq = true
		return searchKey{op: "MODSEQ", n: int64(n)}, err
	case "NOT":
		if err := d.sp(); err != nil {
			return searchKey{}, err
		}
		k, err := p.key()
		return searchKey{op: "NOT", sub: []searchKey{k}}, err
	case "OR":
		if err := d.sp(); err != nil {
			return searchKey{}, err
		}
		k1, err := p.key()
		if err != nil {
			return searchKey{}, err
		}
		if err := d.sp(); err != nil {
			return searchKey{}, err
		}
		k2, err := p.key()
		return searchKey{op: "OR", sub: []searchKey{k1, k2}}, err
	}
	return searchKey{}, syntaxErr("unknown search key")
}

// searchReturn are the ESEARCH return options (RFC 4731, RFC 5182 SAVE).
type searchReturn struct {
	esearch                    bool
	min, max, all, count, save bool
}

// cmdSearch: RFC 3501 section 6.4.4, with ESEARCH (RFC 4731), SEARCHRES
// (RFC 5182) and CHARSET UTF-8. Header keys match the decoded text of
// every field of that name, case-insensitively (searchtext.go); BODY and
// TEXT match the decoded text of the message (searchbody.go).
func (s *session) cmdSearch(ctx context.Context, d *decoder, c *command) (string, error) {
	if err := d.sp(); err != nil {
		return "", err
	}
	var ret searchReturn
	save := d.line
	if a, err := d.atom(""); err == nil && strings.EqualFold(a, "RETURN") {
		ret.esearch = true
		if err := d.sp(); err != nil {
			return "", err
		}
		err := d.list(func() error {
			o, err := d.atom("")
			switch strings.ToUpper(o) {
			case "MIN":
				ret.min = true
			case "MAX":
				ret.max = true
			case "ALL":
				ret.all = true
			case "COUNT":
				ret.count = true
			case "SAVE":
				ret.save = true
			default:
				return syntaxErr("unknown RETURN option")
			}
			return err
		})
		if err != nil {
			return "", err
		}
		if !ret.min && !ret.max && !ret.count && !ret.save {
			ret.all = true
		}
		if err := d.sp(); err != nil {
			return "", err
		}
		save = d.line
	} else {
		d.line = save
	}
	if a, err := d.atom(""); err == nil && strings.EqualFold(a, "CHARSET") {
		if err := d.sp(); err != nil {
			return "", err
		}
		if err := parseCharset(d); err != nil {
			return "", err
		}
		if err := d.sp(); err != nil {
			return "", err
		}
	} else {
		d.line = save
	}
	keys, modseq, err := s.parseCriteria(d)
	if err != nil {
		return "", err
	}
	if s.rev2 && !ret.esearch {
		// RFC 9051 section 6.4.4: ESEARCH, and ALL when nothing else is
		// asked for.
		ret.esearch, ret.all = true, true
	}
	hits, err := s.matching(ctx, keys)
	if err != nil {
		return "", err
	}
	if ret.save {
		s.saved = s.saved[:0]
		for _, m := range hits {
			s.saved = append(s.saved, m.UID)
		}
	}
	num := func(m mailbox.Message) uint32 {
		if c.uid {
			return m.UID
		}
		return m.Seq
	}
	var highest uint64
	for _, m := range hits {
		highest = max(highest, m.ModSeq)
	}
	e := &s.enc
	if !ret.esearch {
		e.raw("* SEARCH")
		for _, m := range hits {
			e.sp().num(num(m))
		}
		if modseq && len(hits) > 0 {
			e.raw(" (MODSEQ ").num64(highest).raw(")")
		}
		e.crlf()
		return c.name + " completed", nil
	}
	if ret.save && !ret.min && !ret.max && !ret.count && !ret.all {
		// RFC 5182 section 2.4: SAVE alone returns no ESEARCH.
		return c.name + " completed", nil
	}
	e.raw(`* ESEARCH (TAG "`).raw(c.tag).raw(`")`)
	if c.uid {
		e.raw(" UID")
	}
	if len(hits) > 0 {
		if ret.min {
			e.raw(" MIN ").num(num(hits[0]))
		}
		if ret.max {
			e.raw(" MAX ").num(num(hits[len(hits)-1]))
		}
		if ret.all {
			nums := make([]uint32, len(hits))
			for i, m := range hits {
				nums[i] = num(m)
			}
			e.raw(" ALL ").raw(uidRange(nums))
		}
	}
	if ret.count {
		e.raw(" COUNT ").num(uint32(len(hits)))
	}
	if modseq && len(hits) > 0 {
		e.raw(" MODSEQ ").num64(highest)
	}
	e.crlf()
	return c.name + " completed", nil
}

// parseCharset reads a search charset (RFC 3501 section 6.4.4): UTF-8 and
// US-ASCII are supported, anything else is NO [BADCHARSET].
func parseCharset(d *decoder) error {
	cs, err := d.astring()
	if err != nil {
		return err
	}
	if !strings.EqualFold(cs, "UTF-8") && !strings.EqualFold(cs, "US-ASCII") {
		return &protoError{no: true, code: "BADCHARSET (UTF-8 US-ASCII)", text: "unsupported charset"}
	}
	return nil
}

// parseCriteria reads the search keys that end a SEARCH, SORT or THREAD
// command, and the end of the command. modseq reports a MODSEQ key, which
// enables CONDSTORE (RFC 7162 section 3.1).
func (s *session) parseCriteria(d *decoder) (keys []searchKey, modseq bool, err error) {
	p := searchParser{d: d}
	if keys, err = p.keys(); err != nil {
		return nil, false, err
	}
	if err := d.end(); err != nil {
		return nil, false, err
	}
	for _, k := range keys {
		if err := checkUTF8(k); err != nil {
			return nil, false, err
		}
	}
	if p.modseq {
		s.enableCondstore()
	}
	return keys, p.modseq, nil
}

// matching returns the messages of the selected mailbox that match every
// key, in sequence order. Messages expunged meanwhile by another session
// are left out.
func (s *session) matching(ctx context.Context, keys []searchKey) ([]mailbox.Message, error) {
	root := searchKey{op: "AND", sub: keys}
	var hits []mailbox.Message
	matchers := make(map[string]*bodyMatcher)
	err := s.view.Messages(ctx, s.candidates(keys), func(m mailbox.Message) error {
		ev := evaluator{s: s, ctx: ctx, m: m, matchers: matchers}
		ok, err := ev.match(root)
		ev.close()
		if err != nil {
			return err
		}
		if ok {
			hits = append(hits, m)
		}
		return nil
	})
	if err != nil && err != mailbox.ErrExpunged {
		return nil, err
	}
	return hits, nil
}

// candidates returns the UIDs (ascending) a search with keys can match:
// the intersection of the UID and sequence sets among the keys that every
// match must satisfy (the top level and nested parenthesized lists), or
// every UID of the view when there are none. The full criteria are still
// evaluated on each candidate, so this only avoids reading messages that
// cannot match: "UID SEARCH UID u:u+9" reads 10 messages, not the mailbox.
func (s *session) candidates(keys []searchKey) []uint32 {
	known := s.view.UIDs()
	var out []uint32
	restricted := false
	var walk func(keys []searchKey)
	walk = func(keys []searchKey) {
		for _, k := range keys {
			var set []uint32
			switch k.op {
			case "AND":
				walk(k.sub)
				continue
			case "UID":
				set = s.uidSetUIDs(k.set, known)
			case "SEQ":
				set = s.seqSetUIDs(k.set, known)
			default:
				continue
			}
			if !restricted {
				out, restricted = set, true
			} else {
				out = intersect(out, set)
			}
		}
	}
	walk(keys)
	if !restricted {
		return known
	}
	return out
}

// uidSetUIDs returns the known UIDs (ascending) a UID set names, as
// containsUID decides them.
func (s *session) uidSetUIDs(set SeqSet, known []uint32) []uint32 {
	if set.Saved {
		var out []uint32
		for _, u := range s.saved {
			if _, ok := slices.BinarySearch(known, u); ok {
				out = append(out, u)
			}
		}
		return sortUnique(out)
	}
	return uidsByUID(set, known)
}

// seqSetUIDs returns the UIDs (ascending) of the sequence numbers a set
// names, as containsSeq decides them: numbers beyond the mailbox match
// nothing.
func (s *session) seqSetUIDs(set SeqSet, known []uint32) []uint32 {
	if set.Saved {
		return s.uidSetUIDs(set, known)
	}
	n := uint32(len(known))
	var out []uint32
	for _, r := range set.Ranges {
		lo, hi := r.bounds(n)
		hi = min(hi, n)
		if lo == 0 || lo > hi {
			continue
		}
		out = append(out, known[lo-1:hi]...)
	}
	return sortUnique(out)
}

func checkUTF8(k searchKey) error {
	if !utf8.ValidString(k.value) {
		return syntaxErr("search string is not UTF-8")
	}
	for _, sk := range k.sub {
		if err := checkUTF8(sk); err != nil {
			return err
		}
	}
	return nil
}

// evaluator matches one message, reading its header and body only when a
// key needs them.
type evaluator struct {
	s    *session
	ctx  context.Context
	m    mailbox.Message
	body mailbox.BodyReader
	hdr  []byte
	read bool
	sum  *mime.Summary
	// matchers are the BODY and TEXT matchers by search string, shared by
	// the evaluators of one search so their buffers are reused.
	matchers map[string]*bodyMatcher
}

func (ev *evaluator) close() {
	if ev.body != nil {
		ev.body.Close()
	}
}

func (ev *evaluator) open() error {
	if ev.read {
		return nil
	}
	b, err := ev.s.view.Open(ev.ctx, ev.m)
	if err != nil {
		return err
	}
	ev.body, ev.read = b, true
	_, ev.hdr, err = scanHeader(b, ev.m.Size)
	return err
}

// summary returns the message's MIME summary, parsing the message if it
// was stored without one.
func (ev *evaluator) summary() (*mime.Summary, error) {
	if ev.sum != nil {
		return ev.sum, nil
	}
	if err := ev.open(); err != nil {
		return nil, err
	}
	sum, err := ev.s.summary(ev.ctx, ev.m, &ev.body)
	ev.sum = sum
	return sum, err
}

// text evaluates BODY or TEXT on the decoded text (searchbody.go).
func (ev *evaluator) text(k searchKey) (bool, error) {
	if k.value == "" {
		return true, nil
	}
	sum, err := ev.summary()
	if err != nil || sum.Root == nil {
		return false, err
	}
	bm := ev.matchers[k.value]
	if bm == nil {
		bm = newBodyMatcher(k.value)
		if ev.matchers == nil {
			ev.matchers = make(map[string]*bodyMatcher)
		}
		ev.matchers[k.value] = bm
	}
	if k.op == "TEXT" && headerTextMatch(ev.hdr, bm.needle) {
		return true, nil
	}
	return bm.message(ev.body, sum.Root, false)
}

func (ev *evaluator) match(k searchKey) (bool, error) {
	m := ev.m
	switch k.op {
	case "ALL":
		return true, nil
	case "AND":
		for _, sk := range k.sub {
			if ok, err := ev.match(sk); !ok || err != nil {
				return false, err
			}
		}
		return true, nil
	case "OR":
		ok, err := ev.match(k.sub[0])
		if ok || err != nil {
			return ok, err
		}
		return ev.match(k.sub[1])
	case "NOT":
		ok, err := ev.match(k.sub[0])
		return !ok, err
	case "FLAG":
		return hasFlag(m.Flags, k.flag), nil
	case "UNFLAG":
		return !hasFlag(m.Flags, k.flag), nil
	case "RECENT":
		return ev.s.recent(m.UID), nil
	case "NEW":
		return ev.s.recent(m.UID) && !hasFlag(m.Flags, `\Seen`), nil
	case "OLD":
		return !ev.s.recent(m.UID), nil
	case "LARGER":
		return m.Size > k.n, nil
	case "MODSEQ":
		return m.ModSeq >= uint64(k.n), nil
	case "SMALLER":
		return m.Size < k.n, nil
	case "BEFORE", "ON", "SINCE":
		return dateMatch(k.op, dayOf(m.InternalDate), k.date), nil
	case "SENTBEFORE", "SENTON", "SENTSINCE":
		if err := ev.open(); err != nil {
			return false, err
		}
		v, ok := headerValue(ev.hdr, "DATE")
		if !ok {
			return false, nil
		}
		t, err := parseMailDate(v)
		if err != nil {
			return false, nil
		}
		return dateMatch(strings.TrimPrefix(k.op, "SENT"), dayOf(t), k.date), nil
	case "UID":
		return containsUID(ev.s, k.set, m.UID, true), nil
	case "SEQ":
		return containsSeq(ev.s, k.set, m.Seq), nil
	case "HEADER":
		if err := ev.open(); err != nil {
			return false, err
		}
		return headerFieldsMatch(ev.hdr, k.field, k.value), nil
	case "BODY", "TEXT":
		return ev.text(k)
	}
	return false, nil
}

// containsUID reports whether a set of UIDs names uid.
func containsUID(s *session, set SeqSet, uid uint32, _ bool) bool {
	if set.Saved {
		for _, u := range s.saved {
			if u == uid {
				return true
			}
		}
		return false
	}
	star := s.view.MaxUID()
	for _, r := range set.Ranges {
		if lo, hi := r.bounds(star); uid >= lo && uid <= hi {
			return true
		}
	}
	return false
}

// containsSeq reports whether a set of sequence numbers names seq; "$"
// names the saved UIDs.
func containsSeq(s *session, set SeqSet, seq uint32) bool {
	if set.Saved {
		return containsUID(s, set, s.view.UID(seq), true)
	}
	for _, r := range set.Ranges {
		if lo, hi := r.bounds(s.view.Len()); seq >= lo && seq <= hi {
			return true
		}
	}
	return false
}

func hasFlag(flags []string, f string) bool {
	for _, x := range flags {
		if strings.EqualFold(x, f) {
			return true
		}
	}
	return false
}

// dayOf is the date of t in its own zone (RFC 3501: dates disregard time
// and timezone).
func dayOf(t time.Time) time.Time {
	return time.Date(t.Year(), t.Month(), t.Day(), 0, 0, 0, 0, time.UTC)
}

func dateMatch(op string, day, key time.Time) bool {
	switch op {
	case "BEFORE":
		return day.Before(key)
	case "ON":
		return day.Equal(key)
	default: // SINCE
		return !day.Before(key)
	}
}

// parseMailDate parses an RFC 5322 date-time leniently.
func parseMailDate(v string) (time.Time, error) {
	v = strings.TrimSpace(v)
	if i := strings.Index(v, "("); i > 0 {
		v = strings.TrimSpace(v[:i])
	}
	var err error
	for _, layout := range []string{time.RFC1123Z, "Mon, _2 Jan 2006 15:04:05 -0700", "_2 Jan 2006 15:04:05 -0700", time.RFC1123,
		"Mon, _2 Jan 2006 15:04 -0700", "_2 Jan 2006 15:04 -0700"} {
		var t time.Time
		if t, err = time.Parse(layout, v); err == nil {
			return t, nil
		}
	}
	return time.Time{}, err
}

// headerValue returns the unfolded value (up to maxSearchField octets) of
// the first field called name.
func headerValue(hdr []byte, name string) (string, bool) {
	var val string
	found := eachField(hdr, func(n, v []byte) bool {
		if !strings.EqualFold(string(n), name) {
			return false
		}
		val = string(v)
		return true
	})
	return val, found
}
