package embedded

import (
	"bytes"
	"errors"
	"fmt"

	"github.com/cockroachdb/pebble/v2"

	"quill/internal/store"
	"quill/internal/store/embedded/bodylog"
	"quill/internal/store/embedded/overlay"
)

// txn is the view a transaction function has of the store: reads see the
// committed database, the writes of earlier transactions in the same group,
// and the function's own writes. Writes are buffered per transaction and
// folded into the group batch only if the function succeeds.
type txn struct {
	e *Engine
	// b is the group's batch: the log record's content, and what a group
	// that deletes a key range applies to Pebble (direct). It is never
	// read, so it has no index: reads see grouped, the overlay and
	// Pebble, with ranges hiding what Pebble still holds.
	b *pebble.Batch

	ops     []op
	own     map[string]int // key -> index in ops of its latest write
	touched map[store.ID]store.Mailbox
	added   []store.ID // mailboxes first touched by the current transaction
	// grouped holds the values of the keys written by the group's
	// successful transactions so far, nil meaning deleted: what the
	// group's later transactions read before the overlay and Pebble, and,
	// for cached keys (see hotCache), what the caches take once the group
	// is durable.
	grouped map[string][]byte
	// written is the group's point writes in order: what the overlay
	// takes once the group is durable.
	written []overlay.Write
	// direct: the group deletes a key range, so it is applied to Pebble
	// itself, after the overlay (checkpoint.go).
	direct bool
	// ranges are the group's range deletes so far: Pebble still holds
	// the keys in them, which the group's later reads must not see.
	ranges []op
	// messages holds the values of the message records ('x') written by
	// the group's successful transactions so far, nil meaning deleted:
	// what listCache takes once the group is durable, and what the
	// group's later transactions read before it.
	messages map[string][]byte
	// deltas are the changes in the log segments' live bytes made by the
	// group's successful transactions, applied once the group commits.
	deltas []bodylog.Delta
	// stored: the current transaction stores a body (in the log or in
	// chunks), which a full disk refuses (space.go).
	stored bool
	// bodyMark and deltaMark are where the current transaction's bodies
	// and deltas begin, for rollback.
	bodyMark, deltaMark int
}

type op struct {
	key, value []byte
	del        bool
	rangeEnd   []byte // non-nil: delete [key, rangeEnd)
	// fresh: the key did not exist before this write (txn.insert).
	fresh bool
}

// reset readies the committer's txn for a new group on batch b. The txn
// is reused from group to group, keeping its slices' and maps' capacity:
// making them anew for every group and transaction was a fifth of what
// the committer allocated.
func (t *txn) reset(b *pebble.Batch) {
	t.b = b
	clear(t.touched)
	clear(t.grouped)
	clear(t.messages)
	clear(t.written) // drop the references to the last group's keys and values
	t.written = t.written[:0]
	t.direct = false
	clear(t.ranges)
	t.ranges = t.ranges[:0]
	t.deltas = t.deltas[:0]
}

func (t *txn) begin() {
	clear(t.ops) // drop the references to the last group's keys and values
	t.ops = t.ops[:0]
	clear(t.own)
	t.added = t.added[:0]
	t.stored = false
	t.bodyMark = t.e.blog.Mark()
	t.deltaMark = len(t.deltas)
}

func (t *txn) rollback() {
	for _, id := range t.added {
		delete(t.touched, id)
	}
	t.e.blog.Truncate(t.bodyMark)
	t.deltas = t.deltas[:t.deltaMark]
}

func (t *txn) apply() {
	for _, o := range t.ops {
		var err error
		switch {
		case o.rangeEnd != nil:
			// The overlay holds point writes only: it goes to Pebble
			// before the range delete, and this group after it. A
			// failed checkpoint fails the group (commitGroup).
			_ = t.e.checkpoint("commit")
			t.direct = true
			t.ranges = append(t.ranges, o)
			err = t.b.DeleteRange(o.key, o.rangeEnd, nil)
			t.forgetMessages(o.key)
			for k := range t.grouped {
				if k >= string(o.key) && k < string(o.rangeEnd) {
					delete(t.grouped, k)
				}
			}
		case o.del:
			err = t.b.Delete(o.key, nil)
		default:
			err = t.b.Set(o.key, o.value, nil)
		}
		if err != nil {
			// Batch writes fail only on programming errors (closed batch).
			panic(fmt.Sprintf("embedded: batch write: %v", err))
		}
		if o.rangeEnd != nil {
			continue
		}
		t.written = append(t.written, overlay.Write{Key: o.key, Value: o.value, Del: o.del, Fresh: o.fresh})
		v := o.value
		if o.del {
			v = nil
		}
		t.grouped[string(o.key)] = v
		if o.key[0] == tMessage {
			t.messages[string(o.key)] = v
		}
	}
}

// forgetMessages handles a prefix delete: when it covers a mailbox's
// message records, the mailbox leaves listCache at once (dropping is
// always safe) and the group's own writes of them are forgotten, so that
// the commit cannot bring it back with records Pebble no longer has.
func (t *txn) forgetMessages(p []byte) {
	if len(p) == 0 || p[0] != tMessage {
		return
	}
	if len(p) == 1+len(store.ID{}) {
		var id store.ID
		copy(id[:], p[1:])
		t.e.lists.drop(id)
	} else {
		t.e.lists.reset()
	}
	for k := range t.messages {
		if bytes.HasPrefix([]byte(k), p) {
			delete(t.messages, k)
		}
	}
}

// get returns the value at k as this transaction sees it.
func (t *txn) get(k []byte) ([]byte, error) {
	if i, ok := t.own[string(k)]; ok {
		if t.ops[i].del {
			return nil, store.ErrNotFound
		}
		return t.ops[i].value, nil
	}
	v, ok := t.grouped[string(k)]
	if !ok {
		v, ok = t.cachedMessage(k)
	}
	c := t.e.cacheOf(k)
	if !ok && c != nil {
		v, ok = c.get(k)
	}
	if !ok {
		var err error
		if v, err = t.committed(k); err != nil {
			return nil, err
		}
		if c != nil {
			c.put(string(k), v)
		}
	}
	if v == nil {
		return nil, store.ErrNotFound
	}
	return v, nil
}

// committed reads k, which the group has not written, from the overlay,
// then Pebble; nil means absent. A range delete of the group follows a
// checkpoint, so the overlay holds nothing in it.
func (t *txn) committed(k []byte) ([]byte, error) {
	if v, ok := t.e.pend.Lookup(k); ok || t.rangeDeleted(k) {
		return v, nil
	}
	v, err := t.e.get(t.e.db, k)
	if errors.Is(err, store.ErrNotFound) {
		return nil, nil
	}
	return v, err
}

// cachedMessage answers a read of a message record from listCache, when
// it knows it; nil means absent.
func (t *txn) cachedMessage(k []byte) ([]byte, bool) {
	id, uid, ok := mailboxOfMessageKey(k)
	if !ok {
		return nil, false
	}
	return t.e.lists.lookup(id, uid)
}

// blob reads and decodes the record of blob id as this transaction sees
// it, from the blob cache when the group has not written it.
func (t *txn) blob(id store.ID) (blobRecord, error) {
	k := blobKey(id)
	_, own := t.own[string(k)]
	_, grouped := t.grouped[string(k)]
	if own || grouped {
		v, err := t.get(k)
		if err != nil {
			return blobRecord{}, err
		}
		return decodeBlob(v)
	}
	if r, ok := t.e.blobs.get(id); ok {
		return r, nil
	}
	v, err := t.committed(k)
	if err != nil {
		return blobRecord{}, err
	}
	t.e.blobs.put(id, v)
	if v == nil {
		return blobRecord{}, store.ErrNotFound
	}
	return decodeBlob(v)
}

// message reads and decodes the record of uid in mailbox as this
// transaction sees it; ok is false when there is none.
func (t *txn) message(mailbox store.ID, uid uint32) (msg store.Message, ok bool, err error) {
	v, err := t.get(messageKey(mailbox, uid))
	if errors.Is(err, store.ErrNotFound) {
		return msg, false, nil
	}
	if err != nil {
		return msg, false, err
	}
	msg, err = decodeMessage(uid, v)
	return msg, err == nil, err
}

func (t *txn) exists(k []byte) (bool, error) {
	_, err := t.get(k)
	if errors.Is(err, store.ErrNotFound) {
		return false, nil
	}
	return err == nil, err
}

func (t *txn) set(k, v []byte) {
	t.own[string(k)] = len(t.ops)
	t.ops = append(t.ops, op{key: k, value: v})
}

// insert sets k, which the caller knows does not exist (a new UID's
// message record, a new MODSEQ's change entry, a new blob's records): if
// it is deleted before the next checkpoint, neither write reaches Pebble.
func (t *txn) insert(k, v []byte) {
	t.own[string(k)] = len(t.ops)
	t.ops = append(t.ops, op{key: k, value: v, fresh: true})
}

func (t *txn) del(k []byte) {
	t.own[string(k)] = len(t.ops)
	t.ops = append(t.ops, op{key: k, del: true})
}

// deletePrefix deletes every key with prefix p. Reads of such keys within
// the same transaction are not supported (callers never need them).
func (t *txn) deletePrefix(p []byte) {
	if t.e.cacheOf(p) != nil || p[0] == tBlob {
		// The caches see point writes only (hotCache, blobCache).
		panic(fmt.Sprintf("embedded: prefix delete in cached table %q", p[0]))
	}
	t.ops = append(t.ops, op{key: p, rangeEnd: prefixEnd(p)})
}

// scan calls fn for every committed-or-grouped key with prefix p (not the
// transaction's own writes), in key order.
func (t *txn) scan(p []byte, fn func(k, v []byte) error) error {
	if err := t.e.settle(p); err != nil {
		return err
	}
	// Settled, the overlay holds nothing under p, and only the committer
	// (this goroutine) adds to it: Pebble and the group's writes are all.
	end := prefixEnd(p)
	it, err := t.e.db.NewIter(&pebble.IterOptions{LowerBound: p, UpperBound: end})
	if err != nil {
		return err
	}
	v := overlay.NewView(it, overlay.WithAbove(nil, t.grouped, p, end))
	defer v.Close()
	for ok := v.First(); ok; ok = v.Next() {
		if !v.FromOverlay() && t.rangeDeleted(v.Key()) {
			continue
		}
		if err := fn(v.Key(), v.Value()); err != nil {
			return err
		}
	}
	return v.Error()
}

// rangeDeleted reports whether one of the group's range deletes covers k.
func (t *txn) rangeDeleted(k []byte) bool {
	for _, r := range t.ranges {
		if bytes.Compare(k, r.key) >= 0 && bytes.Compare(k, r.rangeEnd) < 0 {
			return true
		}
	}
	return false
}

// mailbox reads a mailbox record for update and fences it: its pre-group
// state is what readers see until the group is durable.
func (t *txn) mailbox(id store.ID) (store.Mailbox, error) {
	v, err := t.get(mailboxKey(id))
	if err != nil {
		return store.Mailbox{}, err
	}
	m, err := decodeMailbox(v)
	if err != nil {
		return m, err
	}
	if _, ok := t.touched[id]; !ok {
		t.touched[id] = m
		t.added = append(t.added, id)
	}
	return m, nil
}

func (t *txn) putMailbox(m store.Mailbox) { t.set(mailboxKey(m.ID), encodeMailbox(m)) }

func (t *txn) usage(user string) (store.Usage, error) {
	v, err := t.get(usageKey(user))
	if errors.Is(err, store.ErrNotFound) {
		return store.Usage{}, nil
	}
	if err != nil {
		return store.Usage{}, err
	}
	return decodeUsage(v)
}

func (t *txn) addUsage(user string, bytes, msgs int64) error {
	u, err := t.usage(user)
	if err != nil {
		return err
	}
	u.Bytes += bytes
	u.Messages += msgs
	t.set(usageKey(user), encodeUsage(u))
	return nil
}

// putLogBlob stores body as a new blob with refs references, in the log
// record of the transaction's group: the body and its record become durable
// together or not at all.
func (t *txn) putLogBlob(id store.ID, body []byte, refs int64) {
	t.stored = true
	seg, off := t.e.blog.AddBody(body)
	size := int64(len(body))
	t.insert(blobKey(id), encodeBlob(blobRecord{Size: size, Refs: refs, Seg: seg, Off: off}))
	t.deltas = append(t.deltas, bodylog.Delta{Seg: seg, Bytes: size, Blob: id, Add: true})
}

// dropBlob deletes a blob: its record and its bytes, in the log or in
// chunks. Point deletes, not a range tombstone: expunges are frequent, and
// every range tombstone in the memtable makes every read fragment them (a
// third of the CPU under the POP3 mix before this).
func (t *txn) dropBlob(id store.ID, r blobRecord) {
	t.del(blobKey(id))
	if r.Seg != 0 {
		if t.e.blog.IsFrozen(r.Seg) {
			t.del(loggedKey(r.Seg, id))
		}
		t.deltas = append(t.deltas, bodylog.Delta{Seg: r.Seg, Bytes: r.Size, Blob: id})
		return
	}
	for n := uint32(0); n < r.Chunks; n++ {
		t.del(chunkKey(id, n))
	}
}

// addBlobRef adjusts a blob's reference count by delta, deleting the blob
// when it drops to zero and its pending mark when it is first referenced.
func (t *txn) addBlobRef(id store.ID, delta int64) error {
	r, err := t.blob(id)
	if err != nil {
		return fmt.Errorf("blob %s: %w", id, err)
	}
	if r.Refs == 0 && delta > 0 {
		t.del(pendingKey(id))
	}
	r.Refs += delta
	if r.Refs <= 0 {
		t.dropBlob(id, r)
		return nil
	}
	t.set(blobKey(id), encodeBlob(r))
	return nil
}
