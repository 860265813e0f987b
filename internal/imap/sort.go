package imap

import (
	"cmp"
	"context"
	"slices"
	"strings"

	"quill/internal/mailbox"
	"quill/internal/mime"
)

// SORT (RFC 5256 section 3) with the DISPLAYFROM and DISPLAYTO keys of RFC
// 5957 (SORT=DISPLAY). Keys come from the message summaries stored at
// delivery or APPEND (mime.Summary), so sorting reads no body unless a
// message was stored without one. Strings compare with i;ascii-casemap;
// messages equal on every key stay in mailbox order (section 3, SORT).

// sortKey is one sort-key, possibly reversed.
type sortKey struct {
	name    string // ARRIVAL, CC, DATE, FROM, SIZE, SUBJECT, TO, DISPLAYFROM, DISPLAYTO
	reverse bool
}

// maxSortKeys bounds the sort criteria of one command; RFC 5256 defines
// nine keys, so more than that repeats one.
const maxSortKeys = 16

// sortItem is one matching message with the keys SORT and THREAD compare.
type sortItem struct {
	m mailbox.Message
	// sent is the RFC 5256 section 2.2 sent date: the Date field, or the
	// internal date when the field is absent or unparseable.
	sent int64
	// subject is the base subject (section 2.1), ascii-casemapped.
	subject          string
	isReplyOrForward bool
	from, to, cc     string // mailbox keys, ascii-casemapped
	dispFrom, dispTo string // RFC 5957 display keys, ascii-casemapped
	msgID            string
	parents          []string
}

// cmdSort: RFC 5256 section 3, SORT and UID SORT.
func (s *session) cmdSort(ctx context.Context, d *decoder, c *command) (string, error) {
	if err := d.sp(); err != nil {
		return "", err
	}
	keys, err := parseSortCriteria(d)
	if err != nil {
		return "", err
	}
	items, modseq, err := s.sortCandidates(ctx, d)
	if err != nil {
		return "", err
	}
	slices.SortStableFunc(items, func(a, b sortItem) int {
		for _, k := range keys {
			r := compareKey(k.name, &a, &b)
			if k.reverse {
				r = -r
			}
			if r != 0 {
				return r
			}
		}
		return 0
	})
	e := s.enc.raw("* SORT")
	var highest uint64
	for _, it := range items {
		if c.uid {
			e.sp().num(it.m.UID)
		} else {
			e.sp().num(it.m.Seq)
		}
		highest = max(highest, it.m.ModSeq)
	}
	if modseq && len(items) > 0 {
		// RFC 7162 section 3.1.5.
		e.raw(" (MODSEQ ").num64(highest).raw(")")
	}
	e.crlf()
	return c.name + " completed", nil
}

// parseSortCriteria reads "(" sort-criterion *(SP sort-criterion) ")"
// (RFC 5256 section 4, with RFC 5957's DISPLAYFROM and DISPLAYTO).
func parseSortCriteria(d *decoder) ([]sortKey, error) {
	var keys []sortKey
	reverse := false
	err := d.list(func() error {
		a, err := d.atom("")
		if err != nil {
			return err
		}
		a = strings.ToUpper(a)
		if a == "REVERSE" {
			if reverse {
				return syntaxErr("REVERSE twice")
			}
			reverse = true
			return nil
		}
		switch a {
		case "ARRIVAL", "CC", "DATE", "FROM", "SIZE", "SUBJECT", "TO", "DISPLAYFROM", "DISPLAYTO":
		default:
			return syntaxErr("unknown sort key")
		}
		if len(keys) == maxSortKeys {
			return &protoError{code: "LIMIT", text: "too many sort keys"}
		}
		keys = append(keys, sortKey{name: a, reverse: reverse})
		reverse = false
		return nil
	})
	if err != nil {
		return nil, err
	}
	if reverse || len(keys) == 0 {
		return nil, syntaxErr("expected a sort key")
	}
	return keys, nil
}

func compareKey(name string, a, b *sortItem) int {
	switch name {
	case "ARRIVAL":
		return a.m.InternalDate.Compare(b.m.InternalDate)
	case "DATE":
		return cmp.Compare(a.sent, b.sent)
	case "SIZE":
		return cmp.Compare(a.m.Size, b.m.Size)
	case "SUBJECT":
		return strings.Compare(a.subject, b.subject)
	case "FROM":
		return strings.Compare(a.from, b.from)
	case "TO":
		return strings.Compare(a.to, b.to)
	case "CC":
		return strings.Compare(a.cc, b.cc)
	case "DISPLAYFROM":
		return strings.Compare(a.dispFrom, b.dispFrom)
	case "DISPLAYTO":
		return strings.Compare(a.dispTo, b.dispTo)
	}
	return 0
}

// sortItems derives the SORT and THREAD keys of msgs (in mailbox order)
// from their summaries.
// sortCandidates parses the " charset SP search-criteria" that SORT and
// THREAD share (RFC 5256 section 3) and returns the matching messages with
// their sort keys, and whether the criteria named MODSEQ.
func (s *session) sortCandidates(ctx context.Context, d *decoder) ([]sortItem, bool, error) {
	if err := d.sp(); err != nil {
		return nil, false, err
	}
	if err := parseCharset(d); err != nil {
		return nil, false, err
	}
	if err := d.sp(); err != nil {
		return nil, false, err
	}
	criteria, modseq, err := s.parseCriteria(d)
	if err != nil {
		return nil, false, err
	}
	hits, err := s.matching(ctx, criteria)
	if err != nil {
		return nil, false, err
	}
	items, err := s.sortItems(ctx, hits)
	return items, modseq, err
}

func (s *session) sortItems(ctx context.Context, msgs []mailbox.Message) ([]sortItem, error) {
	items := make([]sortItem, len(msgs))
	for i, m := range msgs {
		var body mailbox.BodyReader
		sum, err := s.summary(ctx, m, &body)
		if body != nil {
			body.Close()
		}
		if err != nil {
			return nil, err
		}
		it := sortItem{m: m, sent: m.InternalDate.Unix()}
		if sum.HasDate {
			it.sent = sum.Date
		}
		it.subject = casemap(sum.BaseSubject)
		it.isReplyOrForward = sum.IsReplyOrForward
		it.from = casemap(sum.SortMailbox(mime.From))
		it.to = casemap(sum.SortMailbox(mime.To))
		it.cc = casemap(sum.SortMailbox(mime.Cc))
		it.dispFrom = casemap(sum.SortDisplay(mime.From))
		it.dispTo = casemap(sum.SortDisplay(mime.To))
		it.msgID = sum.MessageID()
		it.parents = sum.ThreadParents()
		items[i] = it
	}
	return items, nil
}

// casemap is the i;ascii-casemap comparator's mapping (RFC 4790 section
// 9.2): ASCII letters to upper case, every other octet unchanged.
func casemap(s string) string {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c >= 'a' && c <= 'z' {
			b := []byte(s)
			for j := i; j < len(b); j++ {
				if c := b[j]; c >= 'a' && c <= 'z' {
					b[j] = c - 'a' + 'A'
				}
			}
			return string(b)
		}
	}
	return s
}
