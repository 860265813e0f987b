package cassandra

import (
	"context"
	"fmt"
	"slices"
	"time"

	"quill/internal/store"
)

// Reading the batch mode. A reader reads the head first and nothing above
// it: message rows with UID >= UIDNEXT and versions and change log entries
// with MODSEQ > HIGHESTMODSEQ are someone's batch in flight, or what a
// fenced writer left. A message's state is its latest valid version at or
// below the head: a version row of bmessages (a flag change or an expunge)
// is valid if its change log entry exists, which the takeover tombstones
// guarantee for every version a valid batch wrote and for none a fenced
// one did (a version row itself, keyed by UID, lies outside the
// tombstones' ranges); without a valid version, the state is the one the
// message was added with.
//
// The collector waits a grace after a batch before it deletes what the
// batch superseded (batchgc.go), and a read that takes half of it starts
// again: so a read finds every row the head it read shows.
//
// The collector deletes a superseded version's row before its change log
// entry, and an expunged message's rows before its entries. So a version
// whose entry is missing while its row is still there was never valid,
// and one whose row went too was superseded meanwhile by a version above
// the reader's head: the reader then starts again with a new head.

// maxReadAttempts bounds a reader's fresh starts (each needs a
// collection racing it).
const maxReadAttempts = 16

// bversion is a version row: the message changed at modseq.
type bversion struct {
	modseq uint64
	kind   store.ChangeKind
}

// brow is what bmessages holds of one UID.
type brow struct {
	present  bool          // the message row (modseq 0) is there
	msg      store.Message // from the message row: ModSeq is the MODSEQ it was added at
	versions []bversion    // ascending
}

const browColumns = `uid, modseq, kind, added, flags, internal_date, size, blob, meta`

// scanRows groups rows of bmessages by UID, in the order read (a
// descending read leaves each UID's versions descending), calling stop
// with the UIDs read so far before starting each new UID; stop returning
// true ends the scan with more = true.
func scanRows(scan func(...any) bool, stop func(rows []*brow) bool) (rows []*brow, more bool) {
	var cur *brow
	var curUID int64 = -1
	for {
		var uid, modseq int64
		var kind *int8
		var added, size *int64
		var flags *string
		var date *time.Time
		var blob, meta []byte
		if !scan(&uid, &modseq, &kind, &added, &flags, &date, &size, &blob, &meta) {
			return rows, false
		}
		if uid != curUID {
			if stop != nil && stop(rows) {
				return rows, true
			}
			cur = &brow{msg: store.Message{UID: uint32(uid)}}
			curUID = uid
			rows = append(rows, cur)
		}
		if modseq == 0 {
			cur.present = true
			cur.msg.ModSeq = uint64(deref(added))
			cur.msg.Flags = splitFlags(deref(flags))
			cur.msg.InternalDate = deref(date).UTC()
			cur.msg.Size = deref(size)
			copy(cur.msg.Blob[:], blob)
			cur.msg.Meta = meta
			continue
		}
		cur.versions = append(cur.versions, bversion{modseq: uint64(modseq), kind: store.ChangeKind(deref(kind))})
	}
}

// readUIDs reads the rows of uids, all in UID bucket bucket.
func (b *Batches) readUIDs(ctx context.Context, mailbox store.ID, bucket int, uids []int64) ([]*brow, error) {
	it := b.e.read(ctx, `SELECT `+browColumns+` FROM bmessages WHERE mailbox = ? AND bucket = ? AND uid IN ?`,
		mailbox[:], bucket, uids).PageSize(1000).Iter()
	rows, _ := scanRows(it.Scan, nil)
	if err := it.Close(); err != nil {
		return nil, wrap("reading messages", err)
	}
	return rows, nil
}

// readRange reads the rows of UIDs in [from, to) of one bucket, up to need
// UIDs; more reports that there may be further UIDs in the range.
func (b *Batches) readRange(ctx context.Context, mailbox store.ID, bucket int, from, to int64, need int) ([]*brow, bool, error) {
	it := b.e.read(ctx, `SELECT `+browColumns+` FROM bmessages WHERE mailbox = ? AND bucket = ? AND uid >= ? AND uid < ?`,
		mailbox[:], bucket, from, to).PageSize(min(max(2*need, 100), 2000)).Iter()
	rows, more := scanRows(it.Scan, func(rows []*brow) bool { return len(rows) >= need })
	if err := it.Close(); err != nil {
		return nil, false, wrap("listing messages", err)
	}
	return rows, more, nil
}

// errStale asks a reader to start again with a new head.
var errStale = fmt.Errorf("cassandra: read raced a collection")

// resolve returns the messages of rows present at head h, with their
// state, in UID order; errStale when it must start again.
func (b *Batches) resolve(ctx context.Context, mailbox store.ID, h bhead, rows []*brow) ([]store.Message, error) {
	type state struct {
		row      *brow
		cands    []bversion // valid-or-unknown candidates at or below the head, descending
		settled  bool
		kind     store.ChangeKind
		modseq   uint64
		flags    []string
		excluded map[uint64]bool
	}
	var sts []*state
	for _, r := range rows {
		if !r.present || r.msg.UID >= h.UIDNext || r.msg.ModSeq > h.HighestModSeq {
			continue
		}
		s := &state{row: r}
		for i := len(r.versions) - 1; i >= 0; i-- {
			if v := r.versions[i]; v.modseq <= h.HighestModSeq && v.modseq > r.msg.ModSeq {
				s.cands = append(s.cands, v)
			}
		}
		sts = append(sts, s)
	}
	for {
		type key struct {
			bucket  int
			section int
		}
		want := map[key][]uint64{}
		var open []*state
		for _, s := range sts {
			if s.settled {
				continue
			}
			if len(s.cands) == 0 {
				s.settled, s.kind, s.modseq, s.flags = true, store.ChangeAdded, s.row.msg.ModSeq, s.row.msg.Flags
				continue
			}
			c := s.cands[0]
			sec := sectionVersions
			if c.kind == store.ChangeExpunged {
				sec = sectionExpunges
			}
			k := key{bucketOf(c.modseq), sec}
			if !slices.Contains(want[k], c.modseq) {
				want[k] = append(want[k], c.modseq)
			}
			open = append(open, s)
		}
		if len(open) == 0 {
			break
		}
		type entry struct {
			modseq uint64
			uid    uint32
		}
		found := map[entry][]string{}
		for k, mss := range want {
			ms := make([]int64, len(mss))
			for i, m := range mss {
				ms[i] = int64(m)
			}
			it := b.e.read(ctx, `SELECT modseq, uid, flags FROM bchanges WHERE mailbox = ? AND bucket = ? AND section = ? AND modseq IN ?`,
				mailbox[:], k.bucket, int8(k.section), ms).PageSize(1000).Iter()
			var m, u int64
			var fl *string
			for it.Scan(&m, &u, &fl) {
				found[entry{uint64(m), uint32(u)}] = splitFlags(deref(fl))
			}
			if err := it.Close(); err != nil {
				return nil, wrap("reading message versions", err)
			}
		}
		var failed []*state
		for _, s := range open {
			c := s.cands[0]
			if fl, ok := found[entry{c.modseq, s.row.msg.UID}]; ok {
				s.settled, s.kind, s.modseq, s.flags = true, c.kind, c.modseq, fl
				continue
			}
			failed = append(failed, s)
		}
		if len(failed) == 0 {
			continue
		}
		// A version without its entry: never valid if its row is still
		// there, superseded meanwhile if not (see above).
		byBucket := map[int][]int64{}
		for _, s := range failed {
			ub := bucketOf(uint64(s.row.msg.UID))
			byBucket[ub] = append(byBucket[ub], int64(s.row.msg.UID))
		}
		still := map[uint32]*brow{}
		for ub, uids := range byBucket {
			again, err := b.readUIDs(ctx, mailbox, ub, uids)
			if err != nil {
				return nil, err
			}
			for _, r := range again {
				still[r.msg.UID] = r
			}
		}
		for _, s := range failed {
			c := s.cands[0]
			r := still[s.row.msg.UID]
			if r == nil || !r.present || !slices.Contains(r.versions, c) {
				return nil, errStale
			}
			b.log.Debug("ignoring a version without its change log entry (left by a fenced batch)",
				"mailbox", mailbox, "uid", s.row.msg.UID, "modseq", c.modseq)
			s.cands = s.cands[1:]
		}
	}
	var out []store.Message
	for _, s := range sts {
		if s.kind == store.ChangeExpunged {
			continue
		}
		m := s.row.msg
		m.ModSeq, m.Flags = s.modseq, s.flags
		out = append(out, m)
	}
	return out, nil
}

// ListMessages implements store.Engine.
func (b *Batches) ListMessages(ctx context.Context, mailbox store.ID, from uint32, limit int) ([]store.Message, error) {
	if from == 0 {
		from = 1
	}
	for attempt := 0; ; attempt++ {
		out, err := b.listMessages(ctx, mailbox, from, limit)
		if err != errStale || attempt >= maxReadAttempts {
			return out, err
		}
	}
}

func (b *Batches) listMessages(ctx context.Context, mailbox store.ID, from uint32, limit int) ([]store.Message, error) {
	began := time.Now()
	h, err := b.readHead(ctx, mailbox, false)
	if err != nil {
		return nil, err
	}
	var out []store.Message
	end := int64(h.UIDNext)
	for bk := bucketOf(uint64(from)); int64(bk)<<bucketBits < end && len(out) < limit; bk++ {
		start := max(int64(from), int64(bk)<<bucketBits)
		stop := min(end, int64(bk+1)<<bucketBits)
		for start < stop && len(out) < limit {
			rows, more, err := b.readRange(ctx, mailbox, bk, start, stop, limit-len(out))
			if err != nil {
				return nil, err
			}
			msgs, err := b.resolve(ctx, mailbox, h, rows)
			if err != nil {
				return nil, err
			}
			out = append(out, msgs[:min(len(msgs), limit-len(out))]...)
			if !more || len(rows) == 0 {
				break
			}
			start = int64(rows[len(rows)-1].msg.UID) + 1
		}
	}
	return out, b.inGrace(began)
}

// inGrace returns errStale when a read that began at began took half the
// grace or more: rows the head it read shows may have been collected
// meanwhile (batchgc.go). A grace of 0 (a test that switches it off)
// checks nothing.
func (b *Batches) inGrace(began time.Time) error {
	if b.grace > 0 && time.Since(began) >= b.grace/2 {
		return errStale
	}
	return nil
}

// GetMessage implements store.Engine.
func (b *Batches) GetMessage(ctx context.Context, mailbox store.ID, uid uint32) (store.Message, error) {
	for attempt := 0; ; attempt++ {
		began := time.Now()
		h, err := b.readHead(ctx, mailbox, false)
		if err != nil {
			return store.Message{}, err
		}
		if uid == 0 || uid >= h.UIDNext {
			return store.Message{}, fmt.Errorf("message %d: %w", uid, store.ErrNotFound)
		}
		rows, err := b.readUIDs(ctx, mailbox, bucketOf(uint64(uid)), []int64{int64(uid)})
		var msgs []store.Message
		if err == nil {
			msgs, err = b.resolve(ctx, mailbox, h, rows)
		}
		if err == nil {
			err = b.inGrace(began)
		}
		if err == errStale && attempt < maxReadAttempts {
			continue
		}
		if err != nil {
			return store.Message{}, err
		}
		if len(msgs) == 0 {
			return store.Message{}, fmt.Errorf("message %d: %w", uid, store.ErrNotFound)
		}
		return msgs[0], nil
	}
}

// Changes implements store.Engine: the change log entries above since
// and at or below the head, with a flag entry reported only while it is
// its message's latest version (a superseded one not yet collected is
// skipped) and the additions derived from the message rows (batchadded.go),
// read in pages of the three merged.
func (b *Batches) Changes(ctx context.Context, mailbox store.ID, since uint64, limit int) ([]store.Change, error) {
	for attempt := 0; ; attempt++ {
		out, err := b.changes(ctx, mailbox, since, limit)
		if err != errStale || attempt >= maxReadAttempts {
			return out, err
		}
	}
}

func (b *Batches) changes(ctx context.Context, mailbox store.ID, since uint64, limit int) ([]store.Change, error) {
	began := time.Now()
	h, err := b.readHead(ctx, mailbox, false)
	if err != nil {
		return nil, err
	}
	out, err := b.changesAt(ctx, mailbox, since, limit, h)
	if err != nil {
		return nil, err
	}
	if h, err = b.readHead(ctx, mailbox, false); err != nil {
		return nil, err
	}
	if since < h.ExpungeFloor {
		return nil, forgotten(mailbox, since, h.ExpungeFloor)
	}
	return out, b.inGrace(began)
}

// changesAt reads the change log as head h shows it.
func (b *Batches) changesAt(ctx context.Context, mailbox store.ID, since uint64, limit int, h bhead) ([]store.Change, error) {
	if since < h.ExpungeFloor {
		return nil, forgotten(mailbox, since, h.ExpungeFloor)
	}
	upper := h.HighestModSeq
	var out []store.Change
	for cursor := since; cursor < upper && len(out) < limit; {
		need := limit - len(out)
		v, cutV, err := b.fetchSection(ctx, mailbox, sectionVersions, cursor, upper, need)
		if err != nil {
			return nil, err
		}
		x, cutX, err := b.fetchSection(ctx, mailbox, sectionExpunges, cursor, upper, need)
		if err != nil {
			return nil, err
		}
		a, cutA, err := b.addedAfter(ctx, mailbox, h, cursor, need)
		if err != nil {
			return nil, err
		}
		last := upper
		for _, c := range []struct {
			cut     bool
			entries []store.Change
		}{{cutV, v}, {cutX, x}, {cutA, a}} {
			if c.cut {
				last = min(last, c.entries[len(c.entries)-1].ModSeq)
			}
		}
		beyond := func(c store.Change) bool { return c.ModSeq > last }
		// Entries of additions left by keyspaces written before they were
		// derived (batchadded.go) are skipped: a stands for them.
		v = slices.DeleteFunc(v, func(c store.Change) bool { return c.Kind == store.ChangeAdded || beyond(c) })
		v, err = b.latestOnly(ctx, mailbox, h, v)
		if err != nil {
			return nil, err
		}
		merged := slices.DeleteFunc(slices.Concat(v, x, a), beyond)
		slices.SortFunc(merged, func(p, q store.Change) int {
			if p.ModSeq != q.ModSeq {
				return cmpU64(p.ModSeq, q.ModSeq)
			}
			return cmpU64(uint64(p.UID), uint64(q.UID))
		})
		out = append(out, merged...)
		if !cutV && !cutX && !cutA {
			break
		}
		cursor = last
	}
	return out, nil
}

func cmpU64(a, b uint64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// fetchSection reads up to need entries of one section in (after, upper],
// ascending, plus the rest of the last MODSEQ reached; cut reports that
// it stopped before upper.
func (b *Batches) fetchSection(ctx context.Context, mailbox store.ID, section int, after, upper uint64, need int) ([]store.Change, bool, error) {
	var out []store.Change
	for bk := bucketOf(after + 1); bk <= bucketOf(upper) && len(out) < need; bk++ {
		it := b.e.read(ctx, `SELECT modseq, uid, kind FROM bchanges WHERE mailbox = ? AND bucket = ? AND section = ? AND modseq > ? AND modseq <= ? LIMIT ?`,
			mailbox[:], bk, int8(section), int64(after), int64(upper), need-len(out)).PageSize(1000).Iter()
		var ms, uid int64
		var kind int8
		for it.Scan(&ms, &uid, &kind) {
			out = append(out, store.Change{ModSeq: uint64(ms), UID: uint32(uid), Kind: store.ChangeKind(kind)})
		}
		if err := it.Close(); err != nil {
			return nil, false, wrap("reading change log", err)
		}
	}
	if len(out) < need {
		return out, false, nil
	}
	last := out[len(out)-1]
	it := b.e.read(ctx, `SELECT uid, kind FROM bchanges WHERE mailbox = ? AND bucket = ? AND section = ? AND modseq = ? AND uid > ?`,
		mailbox[:], bucketOf(last.ModSeq), int8(section), int64(last.ModSeq), int64(last.UID)).PageSize(1000).Iter()
	var uid int64
	var kind int8
	for it.Scan(&uid, &kind) {
		out = append(out, store.Change{ModSeq: last.ModSeq, UID: uint32(uid), Kind: store.ChangeKind(kind)})
	}
	if err := it.Close(); err != nil {
		return nil, false, wrap("reading change log", err)
	}
	return out, last.ModSeq < upper, nil
}

// latestOnly drops the flag entries that are not their message's latest
// version at head h (superseded, or the message expunged).
func (b *Batches) latestOnly(ctx context.Context, mailbox store.ID, h bhead, changes []store.Change) ([]store.Change, error) {
	byBucket := map[int][]int64{}
	for _, c := range changes {
		if c.Kind != store.ChangeExpunged {
			ub := bucketOf(uint64(c.UID))
			if !slices.Contains(byBucket[ub], int64(c.UID)) {
				byBucket[ub] = append(byBucket[ub], int64(c.UID))
			}
		}
	}
	current := map[uint32]uint64{}
	for ub, uids := range byBucket {
		rows, err := b.readUIDs(ctx, mailbox, ub, uids)
		if err != nil {
			return nil, err
		}
		msgs, err := b.resolve(ctx, mailbox, h, rows)
		if err != nil {
			return nil, err
		}
		for _, m := range msgs {
			current[m.UID] = m.ModSeq
		}
	}
	return slices.DeleteFunc(changes, func(c store.Change) bool {
		return c.Kind != store.ChangeExpunged && current[c.UID] != c.ModSeq
	}), nil
}
