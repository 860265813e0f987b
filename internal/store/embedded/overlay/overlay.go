// Package overlay is the embedded engine's in-memory overlay (ADR 0010's
// write half): the net effect, per key, of the durable commit groups that
// a checkpoint has not yet applied to Pebble, and the view that merges it
// with a Pebble iterator.
//
// The committer merges each durable group's point writes (Merge); readers
// look a key up (Lookup) or take the writes of a span together with a
// Pebble iterator (Snapshot, View); a checkpoint hands the writes to the
// engine to apply to Pebble and then forgets them (Checkpoint). A key
// inserted (Write.Fresh: it did not exist in Pebble) and deleted between
// two checkpoints is cancelled and never applied. Which iterations a key
// concerns is the engine's key layout, given as a Schema.
//
// Rejected alternative: keeping a Pebble batch as the overlay. Its ordered
// index costs an insert per record like the memtable's, and committing it
// would still insert every record, cancelled or not.
package overlay

import (
	"bytes"
	"slices"
	"sync"
	"time"
	"unsafe"
)

// Write is one write to a key: what Merge takes, and the net effect of the
// overlay's groups on a key.
type Write struct {
	// Key and Value: once merged, in the layer's arena (Value unless it
	// is larger than arenaValueMax), where they are never modified.
	Key, Value []byte
	Del        bool
	// Fresh: the key did not exist in Pebble when it entered the overlay
	// (the engine's txn.insert), so deleting it needs no tombstone: a
	// deleted fresh write is cancelled, and a checkpoint skips it.
	Fresh bool
}

// Cancelled reports whether w is a fresh key's deletion: nothing to apply.
func (w *Write) Cancelled() bool { return w.Del && w.Fresh }

// Layer is one generation of the overlay. Its writes are an array indexed
// by a map that only grows until the layer is reset: a cancelled write
// keeps its slot, because deleting from a map under this churn (a third
// of the keys) left the map's probe sequences long enough to cost more
// than the memtable inserts the overlay saves.
type Layer struct {
	schema *Schema
	idx    map[string]int32 // key (in the arena) -> index in w
	w      []Write          // in the order of their keys' first writes
	live   int              // writes in w not cancelled
	// chunk is the arena's current chunk: see hold.
	chunk []byte
	// spans lists the indices in w of each span's writes, so that an
	// iteration of a span can merge them with Pebble (Snapshot).
	spans map[Span][]int32
	users map[string]struct{} // users with writes to user tables in w
	bytes int
	// other: writes to other tables (Schema), which are only iterated
	// after settling.
	other bool
}

func newLayer(s *Schema) *Layer {
	return &Layer{schema: s, idx: make(map[string]int32), spans: make(map[Span][]int32), users: make(map[string]struct{})}
}

func (l *Layer) reset() {
	clear(l.idx)
	clear(l.w) // drop the references to keys and values
	l.w = l.w[:0]
	l.chunk = nil // never reused: readers may still hold values in it
	clear(l.spans)
	clear(l.users)
	l.live, l.bytes, l.other = 0, 0, false
}

// Writes returns l's writes in the order of their keys' first writes, one
// per key, cancelled ones included; the caller must not modify them.
func (l *Layer) Writes() []Write { return l.w }

// Live returns how many of l's writes are not cancelled.
func (l *Layer) Live() int { return l.live }

// Bytes returns the bytes of l's keys and values.
func (l *Layer) Bytes() int { return l.bytes }

// The arena. A layer copies the keys and values it holds into chunks of
// arenaChunk bytes: the collector marks a chunk as one object without
// pointers, where the transactions' keys and values and the index's
// string keys were some 500,000 small objects in a layer under load, the
// most of the live heap, marked again in every cycle (about 7% of the CPU
// went to the collector). Values larger than arenaValueMax (body chunks
// of PutBlob) stay where they are, one object each already.
//
// Chunks are never written again once filled, nor reused after reset: a
// reader may keep a value it got from the layer (Lookup, Snapshot), and
// the index's keys point into them (unsafe.String), so what is in a chunk
// must not change while anything can reach it.
const (
	arenaChunk    = 256 << 10
	arenaValueMax = 1 << 10
)

// hold returns a copy of b in l's arena.
func (l *Layer) hold(b []byte) []byte {
	if len(b) > cap(l.chunk)-len(l.chunk) {
		l.chunk = make([]byte, 0, max(arenaChunk, len(b)))
	}
	n := len(l.chunk)
	l.chunk = append(l.chunk, b...)
	return l.chunk[n:len(l.chunk):len(l.chunk)]
}

// get returns l's write to k, if any.
func (l *Layer) get(k []byte) (*Write, bool) {
	i, ok := l.idx[string(k)]
	if !ok {
		return nil, false
	}
	return &l.w[i], true
}

// note records which iterations l now concerns: the write at index i in
// w, to key k, is the key's first in l.
func (l *Layer) note(k []byte, i int32) {
	if sp, ok := spanOf(l.schema, k); ok {
		l.spans[sp] = append(l.spans[sp], i)
		return
	}
	switch l.schema.tables[k[0]].kind {
	case kindUser:
		l.users[userOf(string(k))] = struct{}{}
		return
	case kindUntracked:
		return // never iterated without settling
	}
	l.other = true
}

// Overlay holds the writes of durable groups not yet applied to Pebble:
// cur, the groups since the last checkpoint began, and applying, those a
// running checkpoint is writing to Pebble. A key's newest value is in cur
// if there, else in applying, else in Pebble: a checkpoint commits applying
// to Pebble before it drops it, so a reader that looks in that order never
// misses a write.
type Overlay struct {
	schema   *Schema
	mu       sync.RWMutex
	cur      *Layer
	applying *Layer // nil when no checkpoint runs
	spare    *Layer
	since    time.Time // when cur received its first write
	failed   error     // a checkpoint failed: applying stays, commits stop

	// ckpt serializes checkpoints.
	ckpt sync.Mutex

	// Counted under mu, for metrics and tests.
	applied, cancelled uint64
}

// New returns an empty overlay over the key layout s.
func New(s *Schema) *Overlay { return &Overlay{schema: s, cur: newLayer(s)} }

// Stats describes the overlay for metrics and tests.
type Stats struct {
	Bytes int // of the keys and values held
	// Since it was made: records applied by checkpoints, and records
	// cancelled (written and deleted between two checkpoints).
	Applied, Cancelled uint64
}

// Stats returns the overlay's counts now.
func (o *Overlay) Stats() Stats {
	o.mu.RLock()
	defer o.mu.RUnlock()
	s := Stats{Bytes: o.cur.bytes, Applied: o.applied, Cancelled: o.cancelled}
	if o.applying != nil {
		s.Bytes += o.applying.bytes
	}
	return s
}

// Lookup returns the overlay's value for k: found reports whether the
// overlay knows k, and v is nil when its newest write deleted it. v lies in
// a layer's arena: it never changes, and holding it keeps the arena's chunk
// alive.
func (o *Overlay) Lookup(k []byte) (v []byte, found bool) {
	o.mu.RLock()
	defer o.mu.RUnlock()
	return o.lookupLocked(k)
}

// Touches reports whether the overlay holds a record that an iteration of
// prefix p could see.
func (o *Overlay) Touches(p []byte) bool {
	o.mu.RLock()
	defer o.mu.RUnlock()
	for _, l := range [...]*Layer{o.cur, o.applying} {
		if l == nil || l.live == 0 {
			continue
		}
		if sp, ok := spanOf(o.schema, string(p)); ok {
			if _, ok := l.spans[sp]; ok {
				return true
			}
			continue
		}
		switch {
		case len(p) > 1 && o.schema.isUser(p):
			if _, ok := l.users[userOf(string(p))]; ok {
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

// Merge folds a durable group's point writes, in order, into the current
// layer, copying their keys and small values: the caller may reuse ws's
// slices once it returns. Committer only.
func (o *Overlay) Merge(ws []Write) {
	o.mu.Lock()
	defer o.mu.Unlock()
	l := o.cur
	if l.live == 0 {
		o.since = time.Now()
	}
	for _, op := range ws {
		p, had := l.get(op.Key)
		if !had {
			i := int32(len(l.w))
			k := l.hold(op.Key)
			l.idx[unsafe.String(unsafe.SliceData(k), len(k))] = i
			l.w = append(l.w, Write{Key: k, Fresh: op.Fresh})
			p = &l.w[i]
			l.bytes += len(k)
			l.note(k, i)
		}
		wasLive := had && !p.Cancelled()
		l.bytes -= len(p.Value)
		if op.Del {
			p.Value, p.Del = nil, true
		} else {
			v := op.Value
			if len(v) <= arenaValueMax {
				v = l.hold(v)
			}
			p.Value, p.Del = v, false
			l.bytes += len(v)
		}
		switch live := !p.Cancelled(); {
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

// Due reports whether the current layer should be checkpointed now: its
// oldest write is interval old, or it holds maxBytes.
func (o *Overlay) Due(interval time.Duration, maxBytes int) bool {
	o.mu.RLock()
	defer o.mu.RUnlock()
	return o.cur.live > 0 && (o.cur.bytes >= maxBytes || time.Since(o.since) >= interval)
}

// Err returns the error of the checkpoint that failed, if one did: the
// overlay can no longer reach Pebble, and the committer must refuse further
// groups.
func (o *Overlay) Err() error {
	o.mu.RLock()
	defer o.mu.RUnlock()
	return o.failed
}

// Checkpoint hands the writes merged since the last checkpoint to apply,
// which must make Pebble hold their net effect (Layer.Writes, less the
// cancelled ones) before it returns nil, and then forgets them. Meanwhile
// readers still find them and Merge fills a new layer above them. With
// nothing to apply it does not call apply. If apply fails, the writes stay
// (readers still see every acknowledged write), and its error is returned
// by Err and by this and every later Checkpoint. Checkpoints run one at a
// time; any goroutine may call it.
func (o *Overlay) Checkpoint(apply func(*Layer) error) error {
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
		o.cur = newLayer(o.schema)
	}
	o.mu.Unlock()

	err := apply(l)
	o.mu.Lock()
	defer o.mu.Unlock()
	if err != nil {
		// applying stays, so readers still see every acknowledged write;
		// the committer refuses further groups (Err).
		o.failed = err
		return o.failed
	}
	o.applied += uint64(l.live) // every write not cancelled
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

// lookupLocked is Lookup for a caller holding o.mu.
func (o *Overlay) lookupLocked(k []byte) (v []byte, found bool) {
	for _, l := range [...]*Layer{o.cur, o.applying} {
		if l == nil {
			continue
		}
		if p, ok := l.get(k); ok {
			if p.Del {
				return nil, true
			}
			return p.Value, true
		}
	}
	return nil, false
}

// Snapshot returns, under one read lock, the overlay's newest writes to
// sp's records in [lo, hi), sorted by key (a cancelled write stays, as a
// deletion), and its value for k as Lookup gives it. It calls open under
// the same lock, to open what the caller reads beneath the overlay (a
// Pebble iterator, which reads at the sequence number it was opened with),
// so that no checkpoint moves a write from the overlay to Pebble between
// the two.
func (o *Overlay) Snapshot(sp Span, lo, hi, k []byte, open func()) (ws []Write, v []byte, found bool) {
	o.mu.RLock()
	defer o.mu.RUnlock()
	ws = o.writesLocked(sp, lo, hi)
	v, found = o.lookupLocked(k)
	open()
	return ws, v, found
}

// writesLocked returns the overlay's newest writes to sp's records in
// [lo, hi), sorted by key. The caller holds o.mu.
func (o *Overlay) writesLocked(sp Span, lo, hi []byte) []Write {
	if o.applying == nil || len(o.applying.spans[sp]) == 0 {
		// One layer, where a key has one write (note): no map to
		// merge layers in.
		var out []Write
		for _, i := range o.cur.spans[sp] {
			if p := o.cur.w[i]; bytes.Compare(p.Key, lo) >= 0 && bytes.Compare(p.Key, hi) < 0 {
				out = append(out, p)
			}
		}
		slices.SortFunc(out, func(a, b Write) int { return bytes.Compare(a.Key, b.Key) })
		return out
	}
	var m map[string]Write
	for _, l := range [...]*Layer{o.applying, o.cur} { // newer last, so it wins
		if l == nil {
			continue
		}
		for _, i := range l.spans[sp] {
			p := l.w[i]
			if bytes.Compare(p.Key, lo) < 0 || bytes.Compare(p.Key, hi) >= 0 {
				continue
			}
			if m == nil {
				m = make(map[string]Write)
			}
			// A cancelled write stays, as a deletion: a fresh key is
			// in no older layer, nor in Pebble, so it hides nothing.
			m[string(p.Key)] = p
		}
	}
	return sortedWrites(m)
}

func sortedWrites(m map[string]Write) []Write {
	if len(m) == 0 {
		return nil
	}
	out := make([]Write, 0, len(m))
	for _, p := range m {
		out = append(out, p)
	}
	slices.SortFunc(out, func(a, b Write) int { return bytes.Compare(a.Key, b.Key) })
	return out
}
