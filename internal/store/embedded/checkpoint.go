package embedded

import (
	"bytes"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"
	"unsafe"

	"github.com/cockroachdb/pebble/v2"

	"quill/internal/store"
)

// ADR 0010's write half: the committer does not apply each durable group to
// Pebble. It folds the group's writes into an in-memory overlay, and a
// checkpoint applies the overlay's net effect to Pebble every few seconds.
// A record written and deleted between two checkpoints (the message,
// change and blob records of mail delivered and retrieved in that time)
// never reaches the memtable, and a record rewritten many times (a busy
// mailbox's or user's counters) reaches it once.
//
// Durability does not move: a group is acknowledged once its log record is
// synced (commitGroup), and the log record holds the group's whole batch.
// Pebble runs without a WAL, and the log position L it holds is written by
// each checkpoint with the position of the last group it covers, so after
// a crash recovery replays every group after the last checkpoint that
// reached Pebble's tables (bodylog.Log.Replay), whatever the overlay held.
// The log cleaner deletes a segment only after a checkpoint and a flush
// that cover it (cleanLog).
//
// Readers see the overlay above Pebble:
//   - point reads (Engine.read, getCommitted, txn.get) consult it between
//     the caches and Pebble;
//   - iterations (listings, Changes, Check, the committer's scans) first
//     settle: they apply the overlay to Pebble and then iterate Pebble
//     alone. They settle only when the overlay holds something in their
//     range (touches), which under load is rare for all but the mailboxes
//     being written.
//
// A group that deletes a key range (deleting a mailbox or a user) is
// applied to Pebble directly, after the overlay: the overlay holds only
// point writes.
//
// Rejected alternative: keeping a Pebble batch as the overlay. Its ordered
// index costs an insert per record like the memtable's, and committing it
// would still insert every record, cancelled or not.

// Checkpoint defaults (Options.CheckpointInterval, CheckpointBytes).
const (
	checkpointInterval = 5 * time.Second
	checkpointBytes    = 64 << 20
)

// pendingWrite is the net effect of the overlay's groups on one key.
type pendingWrite struct {
	key   []byte // in the layer's arena (layer.hold); never modified
	value []byte // in the arena too unless larger than arenaValueMax
	del   bool
	// fresh: the key did not exist in Pebble when it entered the overlay
	// (txn.insert), so deleting it needs no tombstone: a deleted fresh
	// write is cancelled, and a checkpoint skips it.
	fresh bool
}

func (p *pendingWrite) cancelled() bool { return p.del && p.fresh }

// layer is one generation of the overlay. Its writes are an array indexed
// by a map that only grows until the layer is reset: a cancelled write
// keeps its slot, because deleting from a map under this churn (a third
// of the keys) left the map's probe sequences long enough to cost more
// than the memtable inserts the overlay saves.
type layer struct {
	idx  map[string]int32 // key (in the arena) -> index in w
	w    []pendingWrite   // in the order of their keys' first writes
	live int              // writes in w not cancelled
	// chunk is the arena's current chunk: see hold.
	chunk []byte
	// spans lists the indices in w of each span's writes, so that an
	// iteration of a span can merge them with Pebble (spanView).
	spans map[span][]int32
	users map[string]struct{} // users with name or alias records in w
	bytes int
	// other: records of tables that are only iterated after settling
	// (users, aliases, pending marks, chunks).
	other bool
}

// span names records that are iterated together: one mailbox's message,
// change and mailbox records, or one frozen log segment's index entries.
type span struct {
	box store.ID
	seg uint32
	log bool
}

func boxSpan(id store.ID) span { return span{box: id} }
func segSpan(seg uint32) span  { return span{seg: seg, log: true} }

func spanOf[K string | []byte](k K) (span, bool) {
	switch {
	case len(k) >= 1+len(store.ID{}) && (k[0] == tMessage || k[0] == tChange || k[0] == tMailbox):
		var s span
		copy(s.box[:], k[1:])
		return s, true
	case len(k) >= 5 && k[0] == tLogged:
		return segSpan(uint32(k[1])<<24 | uint32(k[2])<<16 | uint32(k[3])<<8 | uint32(k[4])), true
	}
	return span{}, false
}

func newLayer() *layer {
	return &layer{idx: make(map[string]int32), spans: make(map[span][]int32), users: make(map[string]struct{})}
}

func (l *layer) reset() {
	clear(l.idx)
	clear(l.w) // drop the references to keys and values
	l.w = l.w[:0]
	l.chunk = nil // never reused: readers may still hold values in it
	clear(l.spans)
	clear(l.users)
	l.live, l.bytes, l.other = 0, 0, false
}

// The arena. A layer copies the keys and values it holds into chunks of
// arenaChunk bytes: the collector marks a chunk as one object without
// pointers, where the transactions' keys and values and the index's
// string keys were some 500,000 small objects in a layer under load, the
// most of the live heap, marked again in every cycle (about 7% of the CPU
// went to the collector). Values larger than arenaValueMax (body chunks
// of PutBlob) stay where they are, one object each already.
//
// Chunks are never written again once filled, nor reused after reset: a
// reader may keep a value it got from the layer (lookup, spanView), and
// the index's keys point into them (unsafe.String), so what is in a chunk
// must not change while anything can reach it.
const (
	arenaChunk    = 256 << 10
	arenaValueMax = 1 << 10
)

// hold returns a copy of b in l's arena.
func (l *layer) hold(b []byte) []byte {
	if len(b) > cap(l.chunk)-len(l.chunk) {
		l.chunk = make([]byte, 0, max(arenaChunk, len(b)))
	}
	n := len(l.chunk)
	l.chunk = append(l.chunk, b...)
	return l.chunk[n:len(l.chunk):len(l.chunk)]
}

// get returns l's write to k, if any.
func (l *layer) get(k []byte) (*pendingWrite, bool) {
	i, ok := l.idx[string(k)]
	if !ok {
		return nil, false
	}
	return &l.w[i], true
}

// overlay holds the writes of durable groups not yet applied to Pebble:
// cur, the groups since the last checkpoint began, and applying, those a
// running checkpoint is writing to Pebble. A key's newest value is in cur
// if there, else in applying, else in Pebble: a checkpoint commits applying
// to Pebble before it drops it, so a reader that looks in that order never
// misses a write.
type overlay struct {
	mu       sync.RWMutex
	cur      *layer
	applying *layer // nil when no checkpoint runs
	spare    *layer
	since    time.Time // when cur received its first write
	failed   error     // a checkpoint failed: applying stays, commits stop

	// ckpt serializes checkpoints.
	ckpt sync.Mutex

	// Counted under mu, for metrics and tests.
	applied, cancelled uint64
}

type overlayStats struct {
	bytes              int
	applied, cancelled uint64
}

func (o *overlay) stats() overlayStats {
	o.mu.RLock()
	defer o.mu.RUnlock()
	s := overlayStats{bytes: o.cur.bytes, applied: o.applied, cancelled: o.cancelled}
	if o.applying != nil {
		s.bytes += o.applying.bytes
	}
	return s
}

func newOverlay() *overlay { return &overlay{cur: newLayer()} }

// lookup returns the overlay's value for k: found reports whether the
// overlay knows k, and v is nil when its newest write deleted it.
func (o *overlay) lookup(k []byte) (v []byte, found bool) {
	o.mu.RLock()
	defer o.mu.RUnlock()
	return o.lookupLocked(k)
}

// touches reports whether the overlay holds a record that an iteration of
// prefix p could see.
func (o *overlay) touches(p []byte) bool {
	o.mu.RLock()
	defer o.mu.RUnlock()
	for _, l := range [...]*layer{o.cur, o.applying} {
		if l == nil || l.live == 0 {
			continue
		}
		if sp, ok := spanOf(string(p)); ok {
			if _, ok := l.spans[sp]; ok {
				return true
			}
			continue
		}
		switch {
		case len(p) > 1 && (p[0] == tName || p[0] == tAliasOf):
			if _, ok := l.users[userOfPrefix(string(p))]; ok {
				return true
			}
		default:
			if l.other {
				return true
			}
		}
	}
	return false
}

// userOfPrefix returns the user of a name or alias-of prefix or key.
func userOfPrefix(p string) string {
	if i := strings.IndexByte(p[1:], 0); i >= 0 {
		return p[1 : 1+i]
	}
	return p[1:]
}

// merge folds a durable group's point writes, in order, into cur.
// Committer only.
func (o *overlay) merge(ops []op) {
	o.mu.Lock()
	defer o.mu.Unlock()
	l := o.cur
	if l.live == 0 {
		o.since = time.Now()
	}
	for _, op := range ops {
		p, had := l.get(op.key)
		if !had {
			i := int32(len(l.w))
			k := l.hold(op.key)
			l.idx[unsafe.String(unsafe.SliceData(k), len(k))] = i
			l.w = append(l.w, pendingWrite{key: k, fresh: op.fresh})
			p = &l.w[i]
			l.bytes += len(k)
			l.note(k, i)
		}
		wasLive := had && !p.cancelled()
		l.bytes -= len(p.value)
		if op.del {
			p.value, p.del = nil, true
		} else {
			v := op.value
			if len(v) <= arenaValueMax {
				v = l.hold(v)
			}
			p.value, p.del = v, false
			l.bytes += len(v)
		}
		switch live := !p.cancelled(); {
		case live && !wasLive:
			l.live++
		case wasLive && !live:
			// Written since the last checkpoint into a key Pebble never
			// had: nothing to apply.
			l.live--
			o.cancelled++
		}
	}
}

// note records which iterations l now concerns: the write at index i in
// w, to key k, is the key's first in l.
func (l *layer) note(k []byte, i int32) {
	if sp, ok := spanOf(k); ok {
		l.spans[sp] = append(l.spans[sp], i)
		return
	}
	switch k[0] {
	case tName, tAliasOf:
		l.users[userOfPrefix(string(k))] = struct{}{}
		return
	case tUsage, tBlob, tLogPos, tVersion, tSecret:
		return // never iterated outside Check, which settles regardless
	}
	l.other = true
}

// due reports whether cur should be checkpointed now.
func (o *overlay) due(interval time.Duration, maxBytes int) bool {
	o.mu.RLock()
	defer o.mu.RUnlock()
	return o.cur.live > 0 && (o.cur.bytes >= maxBytes || time.Since(o.since) >= interval)
}

func (o *overlay) err() error {
	o.mu.RLock()
	defer o.mu.RUnlock()
	return o.failed
}

// checkpoint applies the overlay's net effect to Pebble, with the log
// position of the last group it covers, and then forgets it. Any goroutine
// may call it; readers call it to settle before iterating Pebble.
func (e *Engine) checkpoint(reason string) error {
	o := e.pend
	o.ckpt.Lock()
	defer o.ckpt.Unlock()
	o.mu.Lock()
	if o.failed != nil {
		o.mu.Unlock()
		return o.failed
	}
	if o.cur.live == 0 {
		// Nothing to apply; cancelled writes may hold memory still.
		o.cur.reset()
		o.mu.Unlock()
		return nil
	}
	l := o.cur
	o.applying = l
	if o.spare != nil {
		o.cur, o.spare = o.spare, nil
	} else {
		o.cur = newLayer()
	}
	o.mu.Unlock()
	start := time.Now()

	// Sized for the whole layer (a record's header is at most 11 bytes,
	// the batch's 12): grown by doubling, a batch of 20-30 MB allocated
	// twice that.
	b := e.db.NewBatchWithSize(l.bytes + 11*l.live + 12)
	defer b.Close()
	var err error
	applied := 0
	for i := range l.w {
		p := &l.w[i]
		if p.cancelled() {
			continue
		}
		applied++
		if p.del {
			err = b.Delete(p.key, nil)
		} else {
			err = b.Set(p.key, p.value, nil)
		}
		if err != nil {
			break
		}
	}
	if err == nil {
		err = b.Commit(pebble.NoSync)
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	if err != nil {
		// applying stays, so readers still see every acknowledged write;
		// the committer refuses further groups (commitGroup).
		o.failed = fmt.Errorf("embedded: checkpoint: %w", err)
		return o.failed
	}
	o.applied += uint64(applied)
	e.checkpointsBy.WithLabelValues(reason).Inc()
	e.ckptSeconds.Observe(time.Since(start).Seconds())
	o.applying = nil
	o.mu.Unlock()
	// No reader can reach l now. Clearing it (megabytes of index and
	// writes) under mu would hold every commit and point read for
	// milliseconds; it becomes spare only once clear.
	l.reset()
	o.mu.Lock()
	o.spare = l
	return nil
}

// settle makes Pebble hold every write the overlay holds for prefix p, so
// that an iteration of Pebble alone sees every acknowledged write in it.
func (e *Engine) settle(p []byte) error {
	if !e.pend.touches(p) {
		return nil
	}
	return e.checkpoint("read")
}

// checkpointLoop checkpoints the overlay once its oldest write is
// CheckpointInterval old or it holds CheckpointBytes; the committer wakes
// it for the latter.
func (e *Engine) checkpointLoop() {
	defer e.wg.Done()
	tick := time.NewTicker(e.opts.CheckpointInterval / 4)
	defer tick.Stop()
	for {
		select {
		case <-e.quit:
			return
		case <-tick.C:
		case <-e.ckptWake:
		}
		if !e.pend.due(e.opts.CheckpointInterval, e.opts.CheckpointBytes) {
			continue
		}
		if err := e.checkpoint("interval"); err != nil && !errors.Is(err, ErrClosed) {
			e.log.Error("store checkpoint failed", "err", err)
		}
	}
}

// read returns the committed value at k for a reader outside the
// committer: from the overlay, else from Pebble.
func (e *Engine) read(k []byte) ([]byte, error) {
	if v, ok := e.pend.lookup(k); ok {
		if v == nil {
			return nil, store.ErrNotFound
		}
		return v, nil
	}
	return e.get(e.db, k)
}

// lookupLocked is lookup for a caller holding o.mu.
func (o *overlay) lookupLocked(k []byte) (v []byte, found bool) {
	for _, l := range [...]*layer{o.cur, o.applying} {
		if l == nil {
			continue
		}
		if p, ok := l.get(k); ok {
			if p.del {
				return nil, true
			}
			return p.value, true
		}
	}
	return nil, false
}

// writesLocked returns the overlay's newest writes to sp's records in
// [lo, hi), sorted by key. The caller holds o.mu.
func (o *overlay) writesLocked(sp span, lo, hi []byte) []pendingWrite {
	if o.applying == nil || len(o.applying.spans[sp]) == 0 {
		// One layer, where a key has one write (note): no map to
		// merge layers in.
		var out []pendingWrite
		for _, i := range o.cur.spans[sp] {
			if p := o.cur.w[i]; bytes.Compare(p.key, lo) >= 0 && bytes.Compare(p.key, hi) < 0 {
				out = append(out, p)
			}
		}
		slices.SortFunc(out, func(a, b pendingWrite) int { return bytes.Compare(a.key, b.key) })
		return out
	}
	var m map[string]pendingWrite
	for _, l := range [...]*layer{o.applying, o.cur} { // newer last, so it wins
		if l == nil {
			continue
		}
		for _, i := range l.spans[sp] {
			p := l.w[i]
			if bytes.Compare(p.key, lo) < 0 || bytes.Compare(p.key, hi) >= 0 {
				continue
			}
			if m == nil {
				m = make(map[string]pendingWrite)
			}
			// A cancelled write stays, as a deletion: a fresh key is
			// in no older layer, nor in Pebble, so it hides nothing.
			m[string(p.key)] = p
		}
	}
	return sortedWrites(m)
}

func sortedWrites(m map[string]pendingWrite) []pendingWrite {
	if len(m) == 0 {
		return nil
	}
	out := make([]pendingWrite, 0, len(m))
	for _, p := range m {
		out = append(out, p)
	}
	slices.SortFunc(out, func(a, b pendingWrite) int { return bytes.Compare(a.key, b.key) })
	return out
}

// spanView opens a consistent view of sp's records in [lo, hi): an
// iterator over Pebble and the overlay's writes above it, taken under one
// read lock so that no checkpoint moves a write between them. above, if
// not nil, holds newer writes still (a commit group's) that override both.
// With withMailbox (a mailbox's span) it also returns the mailbox's record
// as of the view (nil if there is none).
func (e *Engine) spanView(sp span, lo, hi []byte, above map[string][]byte, withMailbox bool) (v *view, mbox []byte, err error) {
	o := e.pend
	mk := mailboxKey(sp.box)
	o.mu.RLock()
	ov := o.writesLocked(sp, lo, hi)
	mbox, found := o.lookupLocked(mk)
	it, err := e.db.NewIter(&pebble.IterOptions{LowerBound: mk, UpperBound: append(mk[:len(mk):len(mk)], 0)})
	o.mu.RUnlock()
	if err != nil {
		return nil, nil, err
	}
	// The iterator reads at the sequence number it was opened with,
	// whatever its bounds.
	if withMailbox && !found && it.First() {
		mbox = append([]byte(nil), it.Value()...)
	}
	if err := it.Error(); err != nil {
		it.Close()
		return nil, nil, err
	}
	it.SetBounds(lo, hi)
	return &view{it: it, ov: withAbove(ov, above, lo, hi)}, mbox, nil
}

// withAbove returns the sorted writes ov with the writes of above in
// [lo, hi) over them (a nil value in above is a deletion).
func withAbove(ov []pendingWrite, above map[string][]byte, lo, hi []byte) []pendingWrite {
	var m map[string]pendingWrite
	for k, val := range above {
		if k < string(lo) || k >= string(hi) {
			continue
		}
		if m == nil {
			m = make(map[string]pendingWrite, len(ov))
			for _, p := range ov {
				m[string(p.key)] = p
			}
		}
		m[k] = pendingWrite{key: []byte(k), value: val, del: val == nil}
	}
	if m == nil {
		return ov
	}
	return sortedWrites(m)
}

// view iterates forward over Pebble's records with the sorted writes ov
// above them: a write in ov replaces the record at its key, or hides it
// when it is a deletion.
type view struct {
	it         *pebble.Iterator
	ov         []pendingWrite
	i          int
	itOK       bool
	key, value []byte
	fromOv     bool // the current record is ov[i]
	shadows    bool // ov[i] hides the iterator's current record
}

func (v *view) First() bool {
	v.itOK, v.i = v.it.First(), 0
	return v.find()
}

func (v *view) Next() bool {
	if v.fromOv {
		v.i++
		if v.shadows {
			v.itOK = v.it.Next()
		}
	} else {
		v.itOK = v.it.Next()
	}
	return v.find()
}

func (v *view) find() bool {
	for {
		hasOv := v.i < len(v.ov)
		switch {
		case !v.itOK && !hasOv:
			return false
		case hasOv && (!v.itOK || bytes.Compare(v.ov[v.i].key, v.it.Key()) <= 0):
			p := v.ov[v.i]
			shadows := v.itOK && bytes.Equal(p.key, v.it.Key())
			if p.del {
				v.i++
				if shadows {
					v.itOK = v.it.Next()
				}
				continue
			}
			v.key, v.value, v.fromOv, v.shadows = p.key, p.value, true, shadows
			return true
		default:
			v.key, v.value, v.fromOv = v.it.Key(), v.it.Value(), false
			return true
		}
	}
}

// Close releases the view's iterator.
func (v *view) Close() error { return v.it.Close() }

// Error reports the iterator's error.
func (v *view) Error() error { return v.it.Error() }
