package imap

import (
	"context"

	"quill/internal/mailbox"
)

// CONDSTORE and QRESYNC (RFC 7162): the pieces shared by SELECT, FETCH,
// STORE, SEARCH and STATUS. Every message has a MODSEQ in the store and
// every expunge leaves a tombstone with its MODSEQ in the change log, so
// no mailbox is ever NOMODSEQ and VANISHED (EARLIER) is exact.

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

// inUIDSet reports whether set (not "$") names uid, with "*" standing for
// star.
func inUIDSet(set SeqSet, uid, star uint32) bool {
	for _, r := range set.Ranges {
		if lo, hi := r.bounds(star); uid >= lo && uid <= hi {
			return true
		}
	}
	return false
}

// writeVanished sends VANISHED (RFC 7162 section 3.2.10) for uids
// (ascending), in pieces that keep lines short.
func (s *session) writeVanished(earlier bool, uids []uint32) {
	const per = 1000
	for len(uids) > 0 {
		n := min(len(uids), per)
		s.enc.raw("* VANISHED ")
		if earlier {
			s.enc.raw("(EARLIER) ")
		}
		s.enc.raw(uidRange(uids[:n])).crlf()
		uids = uids[n:]
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
		kept := vanished[:0]
		for _, u := range vanished {
			if inUIDSet(*within, u, star) {
				kept = append(kept, u)
			}
		}
		vanished = kept
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
