package imap

import (
	"cmp"
	"context"
	"slices"

	"quill/internal/mailbox"
)

// CONDSTORE and QRESYNC (RFC 7162): the pieces shared by SELECT, FETCH,
// STORE, SEARCH and STATUS. Every message has a MODSEQ in the store and
// every expunge leaves a tombstone with its MODSEQ in the change log, so
// no mailbox is ever NOMODSEQ. The store forgets tombstones past a window
// of recent MODSEQs; a resync from before it reports as vanished every
// UID the mailbox no longer holds (mailbox.View.ChangesSince).

// maxModSeq is the largest mod-sequence-value (RFC 7162 section 7: 63
// bits).
const maxModSeq = 1<<63 - 1

// enableCondstore records a CONDSTORE-enabling command (RFC 7162 section
// 3.1). Enabled in the selected state, the client has not yet seen the
// mailbox's HIGHESTMODSEQ, so it is sent now (section 3.1.2.1).
func (s *session) enableCondstore() {
	if s.condstore {
		return
	}
	s.condstore = true
	if s.view != nil {
		s.enc.raw("* OK [HIGHESTMODSEQ ").num64(s.view.HighestModSeq()).raw("] highest modseq").crlf()
	}
}

// modSeq reads a mod-sequence-value; zero is allowed only with zeroOK
// (mod-sequence-valzer).
func (d *decoder) modSeq(zeroOK bool) (uint64, error) {
	n, err := d.number64()
	if err != nil {
		return 0, err
	}
	if n > maxModSeq || (n == 0 && !zeroOK) {
		return 0, syntaxErr("invalid mod-sequence value")
	}
	return n, nil
}

// writeVanished sends VANISHED (RFC 7162 section 3.2.10) for ranges
// (ascending, disjoint), in pieces that keep lines short.
func (s *session) writeVanished(earlier bool, ranges []mailbox.UIDRange) {
	const per = 1000
	for len(ranges) > 0 {
		n := min(len(ranges), per)
		s.enc.raw("* VANISHED ")
		if earlier {
			s.enc.raw("(EARLIER) ")
		}
		for i, r := range ranges[:n] {
			if i > 0 {
				s.enc.raw(",")
			}
			s.enc.num(r.Lo)
			if r.Hi > r.Lo {
				s.enc.raw(":").num(r.Hi)
			}
		}
		s.enc.crlf()
		ranges = ranges[n:]
	}
}

// resync sends what a client resynchronizing from modseq lacks (RFC 7162
// sections 3.2.5 and 3.2.6): VANISHED (EARLIER) for the UIDs of within
// (all if within is nil) expunged since, then FETCH (UID FLAGS MODSEQ)
// for the messages changed since. star is "*" for within.
func (s *session) resync(ctx context.Context, modseq uint64, within *SeqSet, star uint32, only []uint32) error {
	vanished, changed, err := s.view.ChangesSince(ctx, modseq)
	if err != nil {
		return err
	}
	if within != nil {
		vanished = intersectRanges(vanished, normalize(*within, star))
	}
	if len(vanished) > 0 {
		s.writeVanished(true, vanished)
	}
	if only != nil {
		changed = intersect(changed, only)
	}
	err = s.view.Messages(ctx, changed, func(m mailbox.Message) error {
		s.enc.raw("* ").num(m.Seq).raw(" FETCH (UID ").num(m.UID).raw(" FLAGS ").flags(m.Flags, s.recent(m.UID)).
			raw(" MODSEQ (").num64(m.ModSeq).raw("))").crlf()
		return nil
	})
	if err == mailbox.ErrExpunged {
		err = nil
	}
	return err
}

// normalize returns set's ranges, with "*" standing for star, as
// ascending, disjoint, non-adjacent UID ranges.
func normalize(set SeqSet, star uint32) []mailbox.UIDRange {
	out := make([]mailbox.UIDRange, 0, len(set.Ranges))
	for _, r := range set.Ranges {
		lo, hi := r.bounds(star)
		out = append(out, mailbox.UIDRange{Lo: lo, Hi: hi})
	}
	slices.SortFunc(out, func(a, b mailbox.UIDRange) int { return cmp.Compare(a.Lo, b.Lo) })
	merged := out[:0]
	for _, r := range out {
		if n := len(merged); n > 0 && uint64(r.Lo) <= uint64(merged[n-1].Hi)+1 {
			merged[n-1].Hi = max(merged[n-1].Hi, r.Hi)
			continue
		}
		merged = append(merged, r)
	}
	return merged
}

// intersectRanges returns the UIDs in both a and b (each ascending and
// disjoint) as ranges.
func intersectRanges(a, b []mailbox.UIDRange) []mailbox.UIDRange {
	var out []mailbox.UIDRange
	for i, j := 0, 0; i < len(a) && j < len(b); {
		lo, hi := max(a[i].Lo, b[j].Lo), min(a[i].Hi, b[j].Hi)
		if lo <= hi {
			out = append(out, mailbox.UIDRange{Lo: lo, Hi: hi})
		}
		if a[i].Hi < b[j].Hi {
			i++
		} else {
			j++
		}
	}
	return out
}

// intersect returns the UIDs in both a and b (both ascending).
func intersect(a, b []uint32) []uint32 {
	var out []uint32
	for i, j := 0, 0; i < len(a) && j < len(b); {
		switch {
		case a[i] < b[j]:
			i++
		case a[i] > b[j]:
			j++
		default:
			out = append(out, a[i])
			i++
			j++
		}
	}
	return out
}
