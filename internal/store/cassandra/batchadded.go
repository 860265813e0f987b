package cassandra

import (
	"context"
	"slices"

	"quill/internal/store"
)

// Additions in the batch mode's change log. A batch writes no change log
// entry for a message it adds: the message row holds the MODSEQ it was
// added at (bmessages.added), and a mailbox's added MODSEQs never
// decrease as its UIDs increase (store.Batch.Added lists a mailbox's
// additions in that order, and SubmitBatch's assertions put every
// batch's additions above the head before it, in UIDs and in MODSEQs).
// So the messages added after a MODSEQ are the present messages from
// some UID up to UIDNEXT, and Changes reports each of them as added while
// the version it was added with is its latest at the head it read: the
// entries the change log held for additions, derived, one mutation less
// per delivered message (ADR 0026, "Amendment").
//
// Keyspaces written before hold such entries still (section 0, kind
// added); readers skip them, since the derived ones stand for them, and
// the collector deletes them as it always did, when a flag change
// supersedes their version or their message is expunged.

// topScan bounds the messages addedAfter reads down from UIDNEXT looking
// for the last one added at or before since: a poll after a few
// deliveries finds it in one read.
const topScan = 64

// addedAfter returns the additions of head h with MODSEQ above after:
// the messages whose latest version at h is the one they were added with,
// ascending (by MODSEQ and UID, one order). It returns at least need of
// them when there are that many, and then every one of the last MODSEQ
// returned; cut reports that it stopped before h's HIGHESTMODSEQ.
func (b *Batches) addedAfter(ctx context.Context, mailbox store.ID, h bhead, after uint64, need int) ([]store.Change, bool, error) {
	if after >= h.HighestModSeq || h.UIDNext <= 1 {
		return nil, false, nil
	}
	rows, ok, err := b.topRows(ctx, mailbox, h, after)
	if err != nil {
		return nil, false, err
	}
	if ok {
		out, err := b.additions(ctx, mailbox, h, rows, after)
		if err != nil {
			return nil, false, err
		}
		out, cut := firstMODSEQs(out, need)
		return out, cut, nil
	}
	// Many additions: find the first of them, then read up from it.
	from, err := b.firstAddedAfter(ctx, mailbox, h, after)
	if err != nil {
		return nil, false, err
	}
	end := int64(h.UIDNext)
	var out []store.Change
	var lastAdded uint64 // the added MODSEQ of the last message row read
	for bk := bucketOf(uint64(from)); int64(bk)<<bucketBits < end; bk++ {
		start := max(from, int64(bk)<<bucketBits)
		stop := min(end, int64(bk+1)<<bucketBits)
		for start < stop {
			rows, more, err := b.readRange(ctx, mailbox, bk, start, stop, max(need-len(out), topScan))
			if err != nil {
				return nil, false, err
			}
			add, err := b.additions(ctx, mailbox, h, rows, after)
			if err != nil {
				return nil, false, err
			}
			out = append(out, add...)
			for _, r := range rows {
				if r.present {
					lastAdded = r.msg.ModSeq
				}
			}
			// Complete once need are in and a message added later was
			// read: no addition of the MODSEQs returned is left unread.
			if len(out) >= need && out[need-1].ModSeq < lastAdded {
				out, _ = firstMODSEQs(out, need)
				return out, true, nil
			}
			if !more || len(rows) == 0 {
				break
			}
			start = int64(rows[len(rows)-1].msg.UID) + 1
		}
	}
	out, cut := firstMODSEQs(out, need)
	return out, cut, nil
}

// firstMODSEQs keeps the first need changes of out (ascending) and the
// rest of the last MODSEQ kept; cut reports that some were dropped.
func firstMODSEQs(out []store.Change, need int) ([]store.Change, bool) {
	if len(out) <= need {
		return out, false
	}
	k := need
	for k < len(out) && out[k].ModSeq == out[need-1].ModSeq {
		k++
	}
	return out[:k], k < len(out)
}

// additions returns the messages of rows (ascending) that are present at
// h in the version they were added with, added after after.
func (b *Batches) additions(ctx context.Context, mailbox store.ID, h bhead, rows []*brow, after uint64) ([]store.Change, error) {
	added := make(map[uint32]uint64, len(rows))
	for _, r := range rows {
		if r.present {
			added[r.msg.UID] = r.msg.ModSeq
		}
	}
	msgs, err := b.resolve(ctx, mailbox, h, rows)
	if err != nil {
		return nil, err
	}
	var out []store.Change
	for _, m := range msgs {
		if m.ModSeq > after && m.ModSeq == added[m.UID] {
			out = append(out, store.Change{ModSeq: m.ModSeq, UID: m.UID, Kind: store.ChangeAdded})
		}
	}
	return out, nil
}

// topRows reads down from h's UIDNEXT the rows of the messages added
// after after, and returns them ascending; ok is false when it met more
// than topScan UIDs before the last message added at or before after.
func (b *Batches) topRows(ctx context.Context, mailbox store.ID, h bhead, after uint64) (rows []*brow, ok bool, err error) {
	// boundary is the index of the first UID read (descending) that was
	// added at or before after.
	boundary := func(rs []*brow) int {
		return slices.IndexFunc(rs, func(r *brow) bool { return r.present && r.msg.ModSeq <= after })
	}
	end := int64(h.UIDNext)
	for bk := bucketOf(uint64(end - 1)); bk >= 0 && end > 0; bk-- {
		it := b.e.read(ctx, `SELECT `+browColumns+` FROM bmessages WHERE mailbox = ? AND bucket = ? AND uid < ? ORDER BY uid DESC, modseq DESC`,
			mailbox[:], bk, end).PageSize(topScan + 1).Iter()
		got, _ := scanRows(it.Scan, func(rs []*brow) bool {
			// rs's last UID is complete: stop at the boundary or beyond
			// the bound.
			return len(rows)+len(rs) > topScan || (len(rs) > 0 && boundary(rs[len(rs)-1:]) == 0)
		})
		if err := it.Close(); err != nil {
			return nil, false, wrap("reading the latest messages", err)
		}
		i := boundary(got)
		if i >= 0 {
			got = got[:i]
		}
		rows = append(rows, got...)
		if len(rows) > topScan {
			return nil, false, nil
		}
		if i >= 0 {
			break
		}
		end = int64(bk) << bucketBits
	}
	slices.Reverse(rows)
	for _, r := range rows {
		slices.SortFunc(r.versions, func(p, q bversion) int { return cmpU64(p.modseq, q.modseq) })
	}
	return rows, true, nil
}

// firstAddedAfter returns the lowest UID below h's UIDNEXT of a message
// added after after (UIDNEXT if none), by a binary search over the UIDs:
// added MODSEQs never decrease as UIDs increase.
func (b *Batches) firstAddedAfter(ctx context.Context, mailbox store.ID, h bhead, after uint64) (int64, error) {
	// The answer is best, or lies in [lo, hi).
	lo, hi, best := int64(1), int64(h.UIDNext), int64(h.UIDNext)
	for lo < hi {
		mid := lo + (hi-lo)/2
		uid, added, ok, err := b.firstPresent(ctx, mailbox, mid, hi)
		switch {
		case err != nil:
			return 0, err
		case !ok: // no message in [mid, hi)
			hi = mid
		case added > after: // uid is the first at or above mid
			best, hi = uid, mid
		default: // it and every message below it were added earlier
			lo = uid + 1
		}
	}
	return best, nil
}

// firstPresent returns the lowest UID in [from, to) with a message row,
// and the MODSEQ it was added at; ok false if there is none.
func (b *Batches) firstPresent(ctx context.Context, mailbox store.ID, from, to int64) (uid int64, added uint64, ok bool, err error) {
	for bk := bucketOf(uint64(from)); int64(bk)<<bucketBits < to; bk++ {
		it := b.e.read(ctx, `SELECT uid, modseq, added FROM bmessages WHERE mailbox = ? AND bucket = ? AND uid >= ? AND uid < ?`,
			mailbox[:], bk, max(from, int64(bk)<<bucketBits), min(to, int64(bk+1)<<bucketBits)).PageSize(16).Iter()
		var u, ms int64
		var a *int64
		for it.Scan(&u, &ms, &a) {
			if ms == 0 {
				ok = true
				break
			}
		}
		if err := it.Close(); err != nil {
			return 0, 0, false, wrap("searching messages", err)
		}
		if ok {
			return u, uint64(deref(a)), true, nil
		}
	}
	return 0, 0, false, nil
}
