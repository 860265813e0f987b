package cassandra

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	gocql "github.com/apache/cassandra-gocql-driver/v2"

	"quill/internal/store"
)

// Epoch timestamps (ADR 0024): every write of the batch mode to a
// mailbox's head, rows and change log carries 1<<62 | E<<32 | n, above any
// wall-clock timestamp and above every timestamp of every earlier epoch.
// n counts per mailbox within E, from the head's own timestamp: a process
// that restarts within one epoch (a single node is at epoch 1 for good)
// finds its predecessor's n in the head it adopts and fences above it.
const (
	// maxEpoch is the highest epoch a batch may carry; tsForever's
	// epoch is reserved for deletions that must outrank every epoch.
	maxEpoch = 1<<30 - 2
	// maxN is the highest counter within an epoch.
	maxN = 1<<32 - 1
	// window bounds, per mailbox, how far beyond the head last read back
	// with the writer's own epoch (verified) a writer may write (a view
	// may use less: Batches.win): UIDs
	// below verified UIDNEXT + window, MODSEQs at most verified
	// HIGHESTMODSEQ + window, counters below verified n + window. A
	// takeover's tombstones therefore need to cover two partitions of
	// each table, and a restart within an epoch fences at the stored n +
	// window.
	window = 1 << bucketBits
)

// base is the lowest timestamp of epoch E.
func base(epoch uint64) int64 { return int64(1<<62 | epoch<<32) }

// tsForever outranks every epoch's writes: deletions of a whole mailbox.
var tsForever = base(1<<30 - 1)

// headVals are a head's manager-written columns.
type headVals struct {
	uidNext        uint32
	modSeq         uint64
	messages, size int64
	floor          uint64
}

func valsOf(m store.Mailbox) headVals {
	return headVals{uidNext: m.UIDNext, modSeq: m.HighestModSeq, messages: int64(m.Messages), size: m.Size, floor: m.ExpungeFloor}
}

// bmbox is the view's state of a mailbox this process writes.
type bmbox struct {
	id store.ID
	// adopt is held across the I/O of an adoption, a fence, a verification
	// or a bridge; taken after the user's submit lock, before Batches.mu.
	adopt sync.Mutex

	// Guarded by Batches.mu:
	pins     int // holders of a pointer outside a queued batch
	user     string
	epoch    uint64 // the epoch adopted (0: none)
	deposed  uint64 // a later epoch seen in the store
	dirty    bool   // a batch failed: fence again before the next
	pre      headVals
	durable  headVals // the head last written and acknowledged
	dn       int64    // its counter
	v        headVals // the head last read back with this epoch
	vn       int64
	next     int64 // the next counter to hand out
	inflight int   // batches queued and not finished
	changed  chan struct{}
}

// signal wakes those waiting on m's state; b.mu is held.
func (m *bmbox) signal() {
	close(m.changed)
	m.changed = make(chan struct{})
}

// maxStates bounds the mailboxes (and, separately, the users) whose state
// the view keeps; idle ones beyond it are forgotten, and a forgotten
// mailbox is adopted again (a serial read, a fence) at its next batch.
const maxStates = 1 << 18

// mbox returns id's state, creating it, pinned against eviction until
// unpin.
func (b *Batches) mbox(id store.ID) *bmbox {
	b.mu.Lock()
	defer b.mu.Unlock()
	m := b.mboxes[id]
	if m == nil {
		if len(b.mboxes) >= maxStates {
			b.evictLocked()
		}
		m = &bmbox{id: id, changed: make(chan struct{})}
		b.mboxes[id] = m
	}
	m.pins++
	return m
}

func (b *Batches) unpin(m *bmbox) {
	b.mu.Lock()
	m.pins--
	b.mu.Unlock()
}

// evictLocked forgets some idle mailboxes and users (none pinned, nothing
// in flight), in map order.
func (b *Batches) evictLocked() {
	n := 0
	for id, m := range b.mboxes {
		if n >= 64 {
			break
		}
		if m.pins == 0 && m.inflight == 0 {
			delete(b.mboxes, id)
			n++
		}
	}
	n = 0
	for u, p := range b.users {
		if n >= 64 {
			break
		}
		if p.pins == 0 && len(p.jobs) == 0 && !p.writing {
			delete(b.users, u)
			n++
		}
	}
}

// forget drops a deleted mailbox's state.
func (b *Batches) forget(id store.ID) {
	b.mu.Lock()
	delete(b.mboxes, id)
	b.mu.Unlock()
}

// waitIdle waits, with m.adopt held, until no batch of m is in flight.
func (b *Batches) waitIdle(ctx context.Context, m *bmbox) error {
	for {
		b.mu.Lock()
		if m.inflight == 0 {
			b.mu.Unlock()
			return nil
		}
		ch := m.changed
		b.mu.Unlock()
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-ch:
		}
	}
}

// AdoptMailbox implements store.Adopter (ADR 0024, "Taking over a
// mailbox"). It waits for this process's batches of the mailbox in
// flight, reads the head at the serial consistency and, unless this
// process wrote that very head at this epoch and nothing of it failed
// since, fences: range tombstones at base(E)-1 (or, when the head is
// already of epoch E, written by an earlier process of this epoch, at the
// head's n + window) over the message rows with UID >= UIDNEXT and the
// change log entries with MODSEQ > HIGHESTMODSEQ, then the head rewritten
// above them. It fails with ErrConflict if the head is of a later epoch.
func (b *Batches) AdoptMailbox(ctx context.Context, mailbox store.ID, epoch uint64) (store.Mailbox, error) {
	if epoch == 0 || epoch > maxEpoch {
		return store.Mailbox{}, fmt.Errorf("%w: epoch %d", store.ErrInvalid, epoch)
	}
	m := b.mbox(mailbox)
	defer b.unpin(m)
	m.adopt.Lock()
	defer m.adopt.Unlock()
	return b.adoptLocked(ctx, m, epoch)
}

func (b *Batches) adoptLocked(ctx context.Context, m *bmbox, epoch uint64) (store.Mailbox, error) {
	if err := b.waitIdle(ctx, m); err != nil {
		return store.Mailbox{}, err
	}
	h, err := b.readHead(ctx, m.id, true)
	if err != nil {
		return store.Mailbox{}, err
	}
	b.mu.Lock()
	m.user = h.User
	if h.epoch > epoch {
		m.deposed = max(m.deposed, h.epoch)
		b.mu.Unlock()
		return store.Mailbox{}, fmt.Errorf("%w: mailbox %s adopted at epoch %d, after %d", store.ErrConflict, m.id, h.epoch, epoch)
	}
	clean := h.written && m.epoch == epoch && h.epoch == epoch && !m.dirty && h.n == m.dn
	b.mu.Unlock()
	if clean {
		b.mu.Lock()
		m.v, m.vn = valsOf(h.Mailbox), h.n
		b.mu.Unlock()
		return h.Mailbox, nil
	}
	fence, n := base(epoch)-1, int64(0)
	if h.written && h.epoch == epoch {
		b.mu.Lock()
		own := m.epoch == epoch
		used := m.next - 1
		b.mu.Unlock()
		if own {
			// This process adopted the mailbox at this epoch (fencing
			// whatever came before) and has handed out every counter of it
			// since, up to used: fence just above.
			n = max(h.n, used) + 2
		} else {
			// Another process of this epoch (this node before a restart)
			// wrote at most window beyond the head it verified.
			n = h.n + window + 1
		}
		if n > maxN {
			return store.Mailbox{}, fmt.Errorf("%w: mailbox %s has used up epoch %d's timestamps: it needs a new epoch", store.ErrConflict, m.id, epoch)
		}
		fence = base(epoch) + n - 1
	}
	if !b.noFence {
		if err := b.fence(ctx, m.id, h.Mailbox, fence); err != nil {
			return store.Mailbox{}, err
		}
	}
	vals := valsOf(h.Mailbox)
	if err := b.writeHead(ctx, m.id, epoch, base(epoch)+n, vals); err != nil {
		return store.Mailbox{}, wrap("writing the adopted head", err)
	}
	b.mu.Lock()
	m.epoch, m.dirty = epoch, false
	m.pre, m.durable, m.v = vals, vals, vals
	m.dn, m.vn, m.next = n, n, n+1
	m.signal()
	b.mu.Unlock()
	b.log.Info("mailbox adopted", "mailbox", m.id, "epoch", epoch, "uidnext", vals.uidNext, "modseq", vals.modSeq, "n", n)
	return h.Mailbox, nil
}

// fence writes, at timestamp ts, the tombstones that shadow every row a
// writer below ts may have left above the head h: message rows (and their
// versions) with UID >= UIDNEXT, change log entries with MODSEQ >
// HIGHESTMODSEQ. A writer writes at most window beyond the head it last
// verified, which is at or below h, so two partitions of each table hold
// all it may have written.
func (b *Batches) fence(ctx context.Context, id store.ID, h store.Mailbox, ts int64) error {
	e := b.e
	u0, m0 := int64(h.UIDNext), int64(h.HighestModSeq)
	ub, mb := bucketOf(uint64(u0)), bucketOf(uint64(m0))
	qs := []*gocql.Query{
		e.write(ctx, `DELETE FROM bmessages USING TIMESTAMP ? WHERE mailbox = ? AND bucket = ? AND uid >= ?`, ts, id[:], ub, u0),
		e.write(ctx, `DELETE FROM bmessages USING TIMESTAMP ? WHERE mailbox = ? AND bucket = ?`, ts, id[:], ub+1),
		e.write(ctx, `DELETE FROM bchanges USING TIMESTAMP ? WHERE mailbox = ? AND bucket = ? AND section = 0 AND modseq > ?`, ts, id[:], mb, m0),
		e.write(ctx, `DELETE FROM bchanges USING TIMESTAMP ? WHERE mailbox = ? AND bucket = ? AND section = 1 AND modseq > ?`, ts, id[:], mb, m0),
		e.write(ctx, `DELETE FROM bchanges USING TIMESTAMP ? WHERE mailbox = ? AND bucket = ?`, ts, id[:], mb+1),
	}
	return wrap("fencing mailbox "+id.String(), runAll(len(qs), func(i int) error { return qs[i].Exec() }))
}

const headUpdate = `UPDATE bmailboxes USING TIMESTAMP ? SET epoch = ?, uidnext = ?, modseq = ?, messages = ?, size = ?, expunge_floor = ? WHERE id = ?`

func headArgs(id store.ID, epoch uint64, ts int64, v headVals) []any {
	return []any{ts, int64(epoch), int64(v.uidNext), int64(v.modSeq), v.messages, v.size, int64(v.floor), id[:]}
}

func (b *Batches) writeHead(ctx context.Context, id store.ID, epoch uint64, ts int64, v headVals) error {
	return b.e.write(ctx, headUpdate, headArgs(id, epoch, ts, v)...).Exec()
}

// verify reads m's head back at the read consistency, with m.adopt
// held. A head of a later epoch deposes this writer; a head of its own
// epoch becomes the verified one, from which it may write window further.
func (b *Batches) verify(ctx context.Context, m *bmbox, epoch uint64) error {
	h, err := b.readHead(ctx, m.id, false)
	if err != nil {
		return err
	}
	return b.verified(m, epoch, h)
}

// verified records a head read back.
func (b *Batches) verified(m *bmbox, epoch uint64, h bhead) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	switch {
	case h.epoch > epoch:
		m.deposed = max(m.deposed, h.epoch)
		m.signal()
		return fmt.Errorf("%w: mailbox %s adopted at epoch %d, after %d", store.ErrConflict, m.id, h.epoch, epoch)
	case !h.written || h.epoch < epoch:
		// The adoption's own head is gone: treat as a failure.
		m.dirty = true
		m.signal()
		return fmt.Errorf("%w: mailbox %s: head of epoch %d read back at epoch %d", store.ErrConflict, m.id, h.epoch, epoch)
	}
	if h.n > m.vn && m.epoch == epoch {
		m.v, m.vn = valsOf(h.Mailbox), h.n
		m.signal()
	}
	return nil
}

// bpipe is the queue of one user's batches: rows are written at once,
// heads in submission order by one writer at a time.
type bpipe struct {
	submit sync.Mutex // orders SubmitBatch calls of the user

	// Guarded by Batches.mu:
	pins    int // SubmitBatch calls holding it
	jobs    []*bjob
	writing bool // a head writer runs
}

// pipe returns user's queue, pinned until the caller's unpinPipe.
func (b *Batches) pipe(user string) *bpipe {
	b.mu.Lock()
	defer b.mu.Unlock()
	p := b.users[user]
	if p == nil {
		if len(b.users) >= maxStates {
			b.evictLocked()
		}
		p = &bpipe{}
		b.users[user] = p
	}
	p.pins++
	return p
}

func (b *Batches) unpinPipe(p *bpipe) {
	b.mu.Lock()
	p.pins--
	b.mu.Unlock()
}

// bmut is what one batch does to one mailbox: the counter and timestamp
// of its writes and the head after it.
type bmut struct {
	m     *bmbox
	n, ts int64
	vals  headVals
}

// bjob is a queued batch.
type bjob struct {
	pipe  *bpipe
	user  string
	epoch uint64
	muts  []bmut
	// writes are the batch's row writes, run at once; blobs are blobs
	// stored before that the batch references and must find intact after
	// writing its references (blobs.go, "Sharing a blob").
	writes []func(context.Context) error
	blobs  []store.ID
	refs   []refRow // its blob_refs rows
	gc     []gcItem

	// Guarded by Batches.mu:
	rowsDone bool
	rowsErr  error
	finished bool
	err      error
	done     chan struct{}
}

func (j *bjob) wait() error {
	<-j.done
	return j.err
}

// refRow is a blob_refs row a batch writes.
type refRow struct {
	blob, mailbox store.ID
	uid, ts       int64
}

// SubmitBatch implements store.BatchWriter. Per mailbox of the batch, it
// first makes sure the mailbox is adopted at the batch's epoch (adopting
// it if not: an adoption is idempotent), fenced again after a failure,
// and within window of its verified head (reading the head back, or
// waiting for batches in flight, when not). It then checks the batch's
// assertions against the head as every earlier queued batch leaves it,
// hands out a counter per mailbox, and queues the batch: its rows are
// written at once, its heads after its rows and after every earlier
// batch's heads of the user. A batch whose rows or heads fail fails with
// every batch of the user queued after it, and their mailboxes are fenced
// again before the next write, so nothing of them becomes visible later
// (unless a head write that reported failure did land: then its batches
// are visible, complete, and reported failed).
func (b *Batches) SubmitBatch(ctx context.Context, bt *store.Batch) (func() error, error) {
	if err := bt.Validate(); err != nil {
		return nil, err
	}
	if bt.Epoch == 0 || bt.Epoch > maxEpoch {
		return nil, fmt.Errorf("%w: batch of epoch %d", store.ErrInvalid, bt.Epoch)
	}
	if int64(len(bt.Added)) > b.win {
		return nil, fmt.Errorf("%w: %d messages in one batch", store.ErrInvalid, len(bt.Added))
	}
	if err := b.require(ctx); err != nil {
		return nil, err
	}
	p := b.pipe(bt.User)
	defer b.unpinPipe(p)
	p.submit.Lock()
	defer p.submit.Unlock()
	muts := make([]bmut, len(bt.Heads))
	for i, h := range bt.Heads {
		muts[i].m = b.mbox(h.Mailbox)
		defer b.unpin(muts[i].m) // a queued batch holds it by inflight
	}
	for {
		for i, h := range bt.Heads {
			if err := b.ready(ctx, muts[i].m, bt.Epoch, h); err != nil {
				return nil, err
			}
		}
		b.mu.Lock()
		ok := true
		for i, h := range bt.Heads {
			if !b.readyLocked(muts[i].m, bt.Epoch, h) {
				ok = false
			}
		}
		if ok {
			break
		}
		b.mu.Unlock() // a failure or a deposition in between: again
	}
	// b.mu is held.
	err := b.assert(bt, muts)
	for i := 0; i < len(muts) && err == nil; i++ {
		if m := muts[i].m; m.next > maxN {
			err = fmt.Errorf("%w: mailbox %s has used up epoch %d's timestamps: it needs a new epoch", store.ErrConflict, m.id, bt.Epoch)
		}
	}
	if err != nil {
		b.mu.Unlock()
		return func() error { return err }, nil
	}
	j := &bjob{pipe: p, user: bt.User, epoch: bt.Epoch, muts: muts, done: make(chan struct{})}
	idx := map[store.ID]int{}
	for i, h := range bt.Heads {
		mu := &muts[i]
		mu.n = mu.m.next
		mu.m.next++
		mu.ts = base(bt.Epoch) + mu.n
		pre := mu.m.pre
		mu.vals = headVals{uidNext: max(pre.uidNext, h.UIDNext), modSeq: max(pre.modSeq, h.HighestModSeq),
			messages: pre.messages + h.Messages, size: pre.size + h.Size, floor: pre.floor}
		idx[h.Mailbox] = i
	}
	for _, x := range bt.Expunged {
		if len(x.Messages) > 0 {
			mu := &muts[idx[x.Mailbox]]
			if f := uint64(b.e.raisedFloor(int64(mu.vals.floor), int64(x.ModSeq))); f > mu.vals.floor {
				j.gc = append(j.gc, gcItem{kind: gcPrune, mailbox: x.Mailbox, from: mu.vals.floor, to: f})
				mu.vals.floor = f
			}
		}
	}
	for i := range muts {
		muts[i].m.pre = muts[i].vals
		muts[i].m.inflight++
	}
	b.plan(j, bt, muts, idx)
	p.jobs = append(p.jobs, j)
	b.mu.Unlock()
	b.e.done.Add(1)
	runners.run(func() { b.writeRows(j) })
	return j.wait, nil
}

// need is how far a batch writes into a mailbox: the head's new UIDNEXT
// and HIGHESTMODSEQ, and one more counter.
func overWindow(m *bmbox, h store.HeadChange, win int64) bool {
	return int64(h.UIDNext) > int64(m.v.uidNext)+win || h.HighestModSeq > m.v.modSeq+uint64(win) || m.next >= m.vn+win
}

// readyLocked reports, with b.mu held, whether a batch of epoch may be
// queued on m now.
func (b *Batches) readyLocked(m *bmbox, epoch uint64, h store.HeadChange) bool {
	return m.epoch == epoch && !m.dirty && m.deposed <= epoch && !overWindow(m, h, b.win)
}

// ready makes m ready for a batch of epoch writing up to h, or fails.
func (b *Batches) ready(ctx context.Context, m *bmbox, epoch uint64, h store.HeadChange) error {
	m.adopt.Lock()
	defer m.adopt.Unlock()
	for attempt := 0; ; attempt++ {
		b.mu.Lock()
		switch {
		case m.deposed > epoch || m.epoch > epoch:
			b.mu.Unlock()
			return fmt.Errorf("%w: mailbox %s is managed at epoch %d, after %d", store.ErrConflict, m.id, max(m.deposed, m.epoch), epoch)
		case m.epoch != epoch || m.dirty:
			b.mu.Unlock()
			if _, err := b.adoptLocked(ctx, m, epoch); err != nil {
				return err
			}
			continue
		case !overWindow(m, h, b.win):
			b.mu.Unlock()
			return nil
		case m.durable != m.v || m.dn != m.vn:
			// Written further than verified: read the head back.
			b.mu.Unlock()
			if err := b.verify(ctx, m, epoch); err != nil {
				return err
			}
			continue
		case m.inflight > 0:
			// Batches in flight hold the window: wait for them.
			ch := m.changed
			b.mu.Unlock()
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-ch:
			}
			continue
		default:
			// Nothing in flight and the head verified, yet the batch is
			// beyond the window: the manager skipped numbers (refused
			// batches never reuse theirs). Bridge: write a head that
			// skips them too, and read it back.
			if attempt > 3 {
				b.mu.Unlock()
				return fmt.Errorf("%w: mailbox %s: batch beyond the window of its verified head", store.ErrConflict, m.id)
			}
			v := m.durable
			if int64(h.UIDNext) > int64(v.uidNext)+b.win {
				v.uidNext = uint32(int64(h.UIDNext) - b.win)
			}
			if h.HighestModSeq > v.modSeq+uint64(b.win) {
				v.modSeq = h.HighestModSeq - uint64(b.win)
			}
			n := m.next
			m.next++
			m.inflight++
			b.mu.Unlock()
			err := b.writeHead(ctx, m.id, epoch, base(epoch)+n, v)
			b.mu.Lock()
			m.inflight--
			if err == nil {
				m.durable, m.dn = v, n
				m.pre.uidNext, m.pre.modSeq = max(m.pre.uidNext, v.uidNext), max(m.pre.modSeq, v.modSeq)
			} else {
				m.dirty = true
			}
			m.signal()
			b.mu.Unlock()
			if err != nil {
				return wrap("writing a bridging head", err)
			}
			if err := b.verify(ctx, m, epoch); err != nil {
				return err
			}
		}
	}
}

// assert checks the batch's assertions that need no read, against the
// head as the batches queued before it leave it (b.mu held): every head
// belongs to the batch's user and moves forward, counts stay in range,
// added UIDs lie at or above UIDNEXT and every new MODSEQ above
// HIGHESTMODSEQ (so none was ever visible), every rewritten or removed
// UID below UIDNEXT at a MODSEQ at most HIGHESTMODSEQ. That a rewritten or
// removed message is present and at the MODSEQ the manager read is not
// checked: it would cost a read per message (ADR 0026).
func (b *Batches) assert(bt *store.Batch, muts []bmut) error {
	pre := map[store.ID]headVals{}
	for i, h := range bt.Heads {
		m := muts[i].m
		p := m.pre
		if m.user != bt.User {
			return fmt.Errorf("%w: batch of %s writes mailbox %s of %s", store.ErrConflict, bt.User, m.id, m.user)
		}
		if h.UIDNext < p.uidNext || h.HighestModSeq < p.modSeq {
			return fmt.Errorf("%w: mailbox %s: head (%d, %d) would move back to (%d, %d)",
				store.ErrConflict, m.id, p.uidNext, p.modSeq, h.UIDNext, h.HighestModSeq)
		}
		if n := p.messages + h.Messages; n < 0 || n > int64(^uint32(0)) || p.size+h.Size < 0 {
			return fmt.Errorf("%w: mailbox %s: counts %d+%d messages, %d+%d octets", store.ErrConflict, m.id, p.messages, h.Messages, p.size, h.Size)
		}
		pre[h.Mailbox] = p
	}
	fresh := func(mb store.ID, modseq uint64) error {
		if p := pre[mb]; modseq <= p.modSeq {
			return fmt.Errorf("%w: mailbox %s: MODSEQ %d not above %d", store.ErrConflict, mb, modseq, p.modSeq)
		}
		return nil
	}
	old := func(mb store.ID, uid uint32, modseq uint64) error {
		if p := pre[mb]; uid >= p.uidNext || modseq > p.modSeq {
			return fmt.Errorf("%w: mailbox %s: message %d at MODSEQ %d is not below the head", store.ErrConflict, mb, uid, modseq)
		}
		return nil
	}
	for _, a := range bt.Added {
		if p := pre[a.Mailbox]; a.Message.UID < p.uidNext {
			return fmt.Errorf("%w: mailbox %s: UID %d below UIDNEXT %d", store.ErrConflict, a.Mailbox, a.Message.UID, p.uidNext)
		}
		if err := fresh(a.Mailbox, a.Message.ModSeq); err != nil {
			return err
		}
	}
	for _, f := range bt.Flagged {
		if err := fresh(f.Mailbox, f.ModSeq); err != nil {
			return err
		}
		if err := old(f.Mailbox, f.UID, f.PrevModSeq); err != nil {
			return err
		}
	}
	for _, x := range bt.Expunged {
		if len(x.Messages) > 0 {
			if err := fresh(x.Mailbox, x.ModSeq); err != nil {
				return err
			}
		}
		for _, em := range x.Messages {
			if err := old(x.Mailbox, em.UID, em.ModSeq); err != nil {
				return err
			}
		}
	}
	return nil
}

// kinds of bmessages version rows and bchanges sections.
const (
	sectionVersions = 0 // added and flag versions: the current state
	sectionExpunges = 1
)

// unitMax bounds the statements of one unlogged batch of one partition;
// smallRows is the most row writes of a batch sent as one request.
const (
	unitMax   = 200
	smallRows = 16
)

// plan builds j's row writes and garbage (b.mu held, for the counters).
func (b *Batches) plan(j *bjob, bt *store.Batch, muts []bmut, idx map[store.ID]int) {
	e := b.e
	type pkey struct {
		table  string
		mb     store.ID
		bucket int
	}
	type row struct {
		k    pkey
		stmt string
		args []any
	}
	var rows []row
	// add queues a row write of mailbox mb (in partition table, key,
	// bucket), stamped with mb's timestamp of this batch: stmt ends in
	// USING TIMESTAMP ?.
	addIn := func(table string, key store.ID, bucket int, mb store.ID, stmt string, args ...any) {
		rows = append(rows, row{pkey{table, key, bucket}, stmt, append(args, muts[idx[mb]].ts)})
	}
	add := func(table string, mb store.ID, bucket int, stmt string, args ...any) {
		addIn(table, mb, bucket, mb, stmt, args...)
	}
	single := func(q func(ctx context.Context) *gocql.Query) {
		j.writes = append(j.writes, func(ctx context.Context) error { return q(ctx).Exec() })
	}
	expunging := map[store.ID]bool{}
	for _, x := range bt.Expunged {
		for _, em := range x.Messages {
			expunging[em.Blob] = true
		}
	}
	checked := map[store.ID]bool{}
	for _, a := range bt.Added {
		mb, msg := a.Mailbox, a.Message
		ts := muts[idx[mb]].ts
		uid := int64(msg.UID)
		date := msg.InternalDate.UTC().Truncate(time.Millisecond)
		if msg.Meta != nil {
			add("m", mb, bucketOf(uint64(msg.UID)), `INSERT INTO bmessages (mailbox, bucket, uid, modseq, added, flags, internal_date, size, blob, meta) VALUES (?, ?, ?, 0, ?, ?, ?, ?, ?, ?) USING TIMESTAMP ?`,
				mb[:], bucketOf(uint64(msg.UID)), uid, int64(msg.ModSeq), joinFlags(msg.Flags), date, msg.Size, msg.Blob[:], msg.Meta)
		} else {
			add("m", mb, bucketOf(uint64(msg.UID)), `INSERT INTO bmessages (mailbox, bucket, uid, modseq, added, flags, internal_date, size, blob) VALUES (?, ?, ?, 0, ?, ?, ?, ?, ?) USING TIMESTAMP ?`,
				mb[:], bucketOf(uint64(msg.UID)), uid, int64(msg.ModSeq), joinFlags(msg.Flags), date, msg.Size, msg.Blob[:])
		}
		// No change log entry: Changes derives additions from the message
		// rows (batchadded.go).
		blob := msg.Blob
		if a.Body != nil {
			body := a.Body
			if len(body) <= chunkSize {
				single(func(ctx context.Context) *gocql.Query {
					return e.write(ctx, `INSERT INTO blobs (id, size, chunks, created, data, owner, owner_uid) VALUES (?, ?, 0, ?, ?, ?, ?)`,
						blob[:], int64(len(body)), time.Now(), body, mb[:], uid)
				})
			} else {
				chunks := (len(body) + chunkSize - 1) / chunkSize
				for c := 0; c < chunks; c++ {
					part := body[c*chunkSize : min(len(body), (c+1)*chunkSize)]
					single(func(ctx context.Context) *gocql.Query {
						return e.write(ctx, `INSERT INTO blob_chunks (id, chunk, data) VALUES (?, ?, ?)`, blob[:], c, part)
					})
				}
				single(func(ctx context.Context) *gocql.Query {
					return e.write(ctx, `INSERT INTO blobs (id, size, chunks, created, owner, owner_uid) VALUES (?, ?, ?, ?, ?, ?)`,
						blob[:], int64(len(body)), chunks, time.Now(), mb[:], uid)
				})
			}
			continue
		}
		addIn("r", blob, 0, mb, `INSERT INTO blob_refs (id, mailbox, uid) VALUES (?, ?, ?) USING TIMESTAMP ?`, blob[:], mb[:], uid)
		j.refs = append(j.refs, refRow{blob: blob, mailbox: mb, uid: uid, ts: ts})
		if !checked[blob] {
			checked[blob] = true
			// A blob this batch also expunges a reference of keeps that
			// reference until after the batch (its release is collected
			// later), and one stored for this message alone has no other
			// holder whose release could doom it: neither needs a check.
			if !expunging[blob] && !a.FreshBlob {
				j.blobs = append(j.blobs, blob)
			}
			j.gc = append(j.gc, gcItem{kind: gcUnmark, mailbox: mb, blob: blob})
		}
	}
	for _, f := range bt.Flagged {
		mb := f.Mailbox
		add("m", mb, bucketOf(uint64(f.UID)), `INSERT INTO bmessages (mailbox, bucket, uid, modseq, kind) VALUES (?, ?, ?, ?, ?) USING TIMESTAMP ?`,
			mb[:], bucketOf(uint64(f.UID)), int64(f.UID), int64(f.ModSeq), int8(store.ChangeFlags))
		add("c", mb, bucketOf(f.ModSeq), `INSERT INTO bchanges (mailbox, bucket, section, modseq, uid, kind, flags) VALUES (?, ?, 0, ?, ?, ?, ?) USING TIMESTAMP ?`,
			mb[:], bucketOf(f.ModSeq), int64(f.ModSeq), int64(f.UID), int8(store.ChangeFlags), joinFlags(f.Flags))
		j.gc = append(j.gc, gcItem{kind: gcSuperseded, mailbox: mb, uid: f.UID, prev: f.PrevModSeq, modseq: f.ModSeq})
	}
	for _, x := range bt.Expunged {
		mb := x.Mailbox
		for _, em := range x.Messages {
			add("m", mb, bucketOf(uint64(em.UID)), `INSERT INTO bmessages (mailbox, bucket, uid, modseq, kind) VALUES (?, ?, ?, ?, ?) USING TIMESTAMP ?`,
				mb[:], bucketOf(uint64(em.UID)), int64(em.UID), int64(x.ModSeq), int8(store.ChangeExpunged))
			add("c", mb, bucketOf(x.ModSeq), `INSERT INTO bchanges (mailbox, bucket, section, modseq, uid, kind) VALUES (?, ?, 1, ?, ?, ?) USING TIMESTAMP ?`,
				mb[:], bucketOf(x.ModSeq), int64(x.ModSeq), int64(em.UID), int8(store.ChangeExpunged))
			j.gc = append(j.gc, gcItem{kind: gcExpunged, mailbox: mb, uid: em.UID, prev: em.ModSeq, modseq: x.ModSeq, blob: em.Blob})
		}
	}
	// A small batch's rows go in one request (an unlogged batch over a
	// few partitions); a large one's in one unlogged batch per partition
	// (of at most unitMax rows), so that no request grows with the batch.
	// Every row write is idempotent (deterministic key, value and
	// timestamp): retried on another host after an error.
	var units []*gocql.Batch
	unit := func() *gocql.Batch {
		u := e.s.Batch(gocql.UnloggedBatch).Consistency(e.opts.WriteConsistency)
		units = append(units, u)
		return u
	}
	if len(rows) <= smallRows {
		u := unit()
		for _, r := range rows {
			u.Entries = append(u.Entries, gocql.BatchEntry{Stmt: r.stmt, Args: r.args, Idempotent: true})
		}
	} else {
		byKey := map[pkey]*gocql.Batch{}
		for _, r := range rows {
			u := byKey[r.k]
			if u == nil || len(u.Entries) >= unitMax {
				u = unit()
				byKey[r.k] = u
			}
			u.Entries = append(u.Entries, gocql.BatchEntry{Stmt: r.stmt, Args: r.args, Idempotent: true})
		}
	}
	for _, u := range units {
		switch len(u.Entries) {
		case 0:
		case 1:
			// One row (a delivery's message row): a statement, not a batch.
			r := u.Entries[0]
			single(func(ctx context.Context) *gocql.Query { return e.write(ctx, r.Stmt, r.Args...) })
		default:
			j.writes = append(j.writes, func(ctx context.Context) error { return e.s.ExecuteBatch(u.WithContext(ctx)) })
		}
	}
	// Each garbage item is collected at its mailbox's timestamp of this
	// batch: above every row it deletes.
	for i := range j.gc {
		mu := muts[idx[j.gc[i].mailbox]]
		j.gc[i].epoch, j.gc[i].ts, j.gc[i].head = j.epoch, mu.ts, mu.vals.modSeq
	}
}

// writeRows writes j's rows, checks the blobs it references, and hands j
// to its user's head writer.
func (b *Batches) writeRows(j *bjob) {
	defer b.e.done.Done()
	ctx := context.Background()
	err := runAll(len(j.writes), func(i int) error { return j.writes[i](ctx) })
	if err != nil {
		err = wrap("writing a batch's rows", err)
	}
	if err == nil {
		for _, blob := range j.blobs {
			if err = b.gc.intact(ctx, blob); err != nil {
				break
			}
		}
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	j.rowsDone, j.rowsErr = true, err
	if p := j.pipe; !p.writing && len(p.jobs) > 0 && p.jobs[0].rowsDone {
		p.writing = true
		b.e.done.Add(1)
		runners.run(func() { b.writeHeads(p) })
	}
}

// writeHeads writes the heads of p's batches whose rows are written, in
// order, many batches in one write when they are ready together (each
// mailbox's head as the last of them leaves it).
func (b *Batches) writeHeads(p *bpipe) {
	defer b.e.done.Done()
	ctx := context.Background()
	for {
		b.mu.Lock()
		var group []*bjob
		var failed *bjob
		for _, j := range p.jobs {
			if !j.rowsDone {
				break
			}
			if j.rowsErr != nil {
				failed = j
				break
			}
			group = append(group, j)
		}
		if len(group) == 0 && failed == nil {
			p.writing = false
			b.mu.Unlock()
			return
		}
		type hw struct {
			m     *bmbox
			epoch uint64
			n, ts int64
			vals  headVals
		}
		var heads []hw
		at := map[*bmbox]int{}
		for _, j := range group {
			for _, mu := range j.muts {
				w := hw{m: mu.m, epoch: j.epoch, n: mu.n, ts: mu.ts, vals: mu.vals}
				if i, ok := at[mu.m]; ok {
					heads[i] = w
				} else {
					at[mu.m] = len(heads)
					heads = append(heads, w)
				}
			}
		}
		b.mu.Unlock()

		var err error
		switch {
		case len(heads) == 1:
			w := heads[0]
			err = b.writeHead(ctx, w.m.id, w.epoch, w.ts, w.vals)
		case len(heads) > 1:
			// Several mailboxes (a MOVE): one logged batch, so that a crash
			// keeps all of the heads or none.
			lb := b.e.s.Batch(gocql.LoggedBatch).Consistency(b.e.opts.WriteConsistency).WithContext(ctx)
			for _, w := range heads {
				lb.Entries = append(lb.Entries, gocql.BatchEntry{Stmt: headUpdate, Args: headArgs(w.m.id, w.epoch, w.ts, w.vals), Idempotent: true})
			}
			err = b.e.s.ExecuteBatch(lb)
		}

		b.mu.Lock()
		if err == nil {
			for _, w := range heads {
				if w.n > w.m.dn {
					w.m.durable, w.m.dn = w.vals, w.n
				}
			}
			// The garbage is queued before the batches are acknowledged,
			// so that a caller that waits for the collector sees it.
			for _, j := range group {
				b.gc.add(j.gc)
				b.finishLocked(j, nil)
			}
			p.jobs = p.jobs[len(group):]
		}
		if err != nil || failed != nil {
			// The batch that failed (the first of the group whose heads
			// failed, or the one whose rows did) and every batch of the
			// user after it fail; their mailboxes are fenced again.
			why := error(nil)
			first := failed
			if err != nil {
				// A head write that failed may have landed (a timeout, a
				// coordinator lost after the write, a retry on another host
				// after either): the group's batches are then visible and
				// complete. Their outcome is unknown, not failed (ADR 0030).
				why = fmt.Errorf("%w: %w (if they were, the batch is visible and complete)", store.ErrOutcomeUnknown, wrap("writing heads", err))
				first = group[0]
			} else {
				why = failed.rowsErr
			}
			var dirty []*bmbox
			for _, j := range p.jobs {
				jerr := why
				if j != first && (err == nil || !slices.Contains(group, j)) {
					jerr = fmt.Errorf("an earlier batch of %s failed: %w", j.user, why)
					if err != nil {
						// Its head was never written: it failed, whatever
						// the outcome of the batch before it.
						jerr = fmt.Errorf("an earlier batch of %s failed: %v", j.user, why)
					}
				}
				for _, mu := range j.muts {
					if !mu.m.dirty {
						mu.m.dirty = true
						dirty = append(dirty, mu.m)
					}
				}
				b.finishLocked(j, jerr)
				if len(j.refs) > 0 && (err == nil || !slices.Contains(group, j)) {
					// Its head was never written, so no message of it
					// will be visible: its references go too.
					b.e.done.Add(1)
					go b.unref(j)
				}
			}
			p.jobs = nil
			for _, m := range dirty {
				m.pins++
				b.e.done.Add(1)
				go b.refence(m, m.epoch)
			}
			b.log.Warn("batch failed; fencing its mailboxes again", "user", first.user, "mailboxes", len(dirty), "err", why)
		}
		b.mu.Unlock()
	}
}

// finishLocked ends j with err (b.mu held).
func (b *Batches) finishLocked(j *bjob, err error) {
	if j.finished {
		return
	}
	j.finished, j.err = true, err
	for _, mu := range j.muts {
		mu.m.inflight--
		mu.m.signal()
	}
	close(j.done)
}

// unref deletes the blob references of a batch that failed before its
// head was written, at the batch's own timestamps (a deletion wins a tie),
// so that they keep no blob alive. Best effort: what it fails to delete is
// a leak Check reports.
func (b *Batches) unref(j *bjob) {
	defer b.e.done.Done()
	ctx, cancel := context.WithTimeout(context.Background(), 2*b.timeout())
	defer cancel()
	for _, r := range j.refs {
		if err := b.e.write(ctx, `DELETE FROM blob_refs USING TIMESTAMP ? WHERE id = ? AND mailbox = ? AND uid = ?`,
			r.ts, r.blob[:], r.mailbox[:], r.uid).Exec(); err != nil {
			b.log.Warn("deleting a failed batch's blob reference; the blob may outlive its messages", "blob", r.blob, "err", err)
		}
	}
}

// refence fences a mailbox again after a failed batch, so that nothing of
// that batch or those after it becomes visible; a later batch would do it
// first anyway.
func (b *Batches) refence(m *bmbox, epoch uint64) {
	defer b.e.done.Done()
	defer b.unpin(m)
	m.adopt.Lock()
	defer m.adopt.Unlock()
	b.mu.Lock()
	again := m.dirty && m.epoch == epoch
	b.mu.Unlock()
	if !again {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 4*b.timeout())
	defer cancel()
	if _, err := b.adoptLocked(ctx, m, epoch); err != nil {
		b.log.Warn("fencing a mailbox after a failed batch; the next batch will", "mailbox", m.id, "err", err)
	}
}

// runAll runs n calls at once, the last on the calling goroutine and the
// others on runners, and returns their errors joined.
func runAll(n int, call func(i int) error) error {
	switch n {
	case 0: // a batch that only moves heads
		return nil
	case 1:
		return call(0)
	}
	var wg sync.WaitGroup
	errs := make([]error, n)
	wg.Add(n - 1)
	for i := 0; i < n-1; i++ {
		runners.run(func() {
			defer wg.Done()
			errs[i] = call(i)
		})
	}
	errs[n-1] = call(n - 1)
	wg.Wait()
	return errors.Join(errs...)
}

// runners run a batch's writes (writeRows, writeHeads, runAll's calls) on
// goroutines that wait for the next instead of exiting, up to
// maxIdleRunners of them: a query grows its goroutine's stack, and a new
// goroutine per write grew one anew every time (runtime.newstack, about 4%
// of a node's CPU). A waiting runner holds what the collector leaves of its
// stack.
var runners = &runnerPool{work: make(chan func())}

const maxIdleRunners = 64

type runnerPool struct {
	work chan func() // unbuffered: a send succeeds only when a runner waits
	idle atomic.Int32
}

// run runs f on a waiting runner, or on a new one.
func (p *runnerPool) run(f func()) {
	select {
	case p.work <- f:
	default:
		go p.runner(f)
	}
}

func (p *runnerPool) runner(f func()) {
	for {
		f()
		if p.idle.Add(1) > maxIdleRunners {
			p.idle.Add(-1)
			return
		}
		f = <-p.work
		p.idle.Add(-1)
	}
}
