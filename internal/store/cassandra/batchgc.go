package cassandra

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"

	"quill/internal/store"
)

// Garbage of the batch mode (ADR 0024: superseded versions, expunged
// rows and superseded change entries are deleted later). A batch's
// garbage is queued once the batch is acknowledged (its heads written)
// and collected by this process's collector, which first reads each
// mailbox's head back at the read consistency and collects only what a
// head of the batch's own epoch, at or above the batch's, covers: a batch
// that a later epoch fenced away supersedes nothing. Every deletion is
// stamped with the superseding batch's timestamp, above every row it
// deletes. Within one item, the uid-keyed rows go before the change log
// entries that validate them (batchread.go relies on that order).
//
// Superseded versions, expunged rows and pruned expunges wait
// Batches.grace after their batch was acknowledged before they are
// collected: a reader that read
// the head before that batch's head write still finds the rows the head
// it read shows (the flag version of a message flagged again since, the
// rows of a message expunged since), provided it finishes within half the
// grace, which readers check (batchread.go). Without the wait, a change
// log read racing a flag change missed the message's version altogether
// (TestChangesSeeTheirHead).
//
// Garbage is soft state: a process that dies loses what it had queued.
// What that leaves is harmless to readers (they take each UID's latest
// valid version) and bounded: the expunged messages' rows are collected
// anyway before the expunge floor passes their expunges (gcPrune), and
// what remains is superseded versions of live messages, collected with
// the message when it is expunged, and the blobs of such messages (a
// leak that Check reports).
type gcKind uint8

const (
	// gcSuperseded: a flag version at modseq supersedes prev.
	gcSuperseded gcKind = iota + 1
	// gcExpunged: uid, at prev, was expunged at modseq; it held blob.
	gcExpunged
	// gcPrune: the expunge floor rose from from to to.
	gcPrune
	// gcUnmark: blob, stored by PutBlob, is referenced. It needs no
	// read-back of the head: it is queued once its batch's head was
	// acknowledged, so the blob_refs row the batch wrote is durable, and
	// nothing but the blob's release deletes that row; from then on the
	// reclaimer (reclaimPending) would only delete the mark and keep the
	// blob, whatever became of the batch. A round deletes the marks of a
	// shard together.
	gcUnmark
)

type gcItem struct {
	kind    gcKind
	mailbox store.ID
	epoch   uint64
	ts      int64  // the superseding batch's timestamp in mailbox
	head    uint64 // its HIGHESTMODSEQ in mailbox
	uid     uint32
	prev    uint64
	modseq  uint64
	from    uint64
	to      uint64
	blob    store.ID
	due     time.Time // not collected before
}

// maxUnmarks bounds the pending marks one statement deletes.
const maxUnmarks = 256

// defaultGrace is Batches.grace: far beyond any reader's run.
const defaultGrace = 20 * time.Second

// collector collects the batch mode's garbage in the background.
type collector struct {
	b *Batches

	mu      sync.Mutex
	queue   []gcItem
	busy    bool          // a round runs
	idle    chan struct{} // closed when the queue is empty and no round runs
	isIdle  bool          // idle is closed
	wake    chan struct{} // buffered: work was queued
	stopped chan struct{}
	running bool
	gone    map[store.ID]bool // deleted mailboxes
	hurry   int               // drains waiting: collect items before they are due
	done    sync.WaitGroup
}

func newCollector(b *Batches) *collector {
	c := &collector{b: b, wake: make(chan struct{}, 1), stopped: make(chan struct{}), idle: make(chan struct{}), isIdle: true, gone: map[store.ID]bool{}}
	close(c.idle)
	return c
}

// add queues items; it never blocks.
func (c *collector) add(items []gcItem) {
	if len(items) == 0 {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	select {
	case <-c.stopped:
		return
	default:
	}
	if c.isIdle {
		c.idle, c.isIdle = make(chan struct{}), false
	}
	due := time.Now().Add(c.b.grace)
	for i := range items {
		if items[i].kind != gcUnmark {
			items[i].due = due
		}
	}
	c.queue = append(c.queue, items...)
	if !c.running {
		c.running = true
		c.done.Add(1)
		go c.loop()
	}
	select {
	case c.wake <- struct{}{}:
	default:
	}
}

// forget drops a deleted mailbox's garbage (deleteMailbox removes it all).
func (c *collector) forget(id store.ID) {
	c.mu.Lock()
	c.gone[id] = true
	c.mu.Unlock()
}

// drain waits until everything queued so far is collected, collecting
// it without waiting for it to be due (Check, Close: a reader racing them
// may miss what the grace is for).
func (c *collector) drain(ctx context.Context) error {
	c.mu.Lock()
	ch := c.idle
	c.hurry++
	c.mu.Unlock()
	defer func() {
		c.mu.Lock()
		c.hurry--
		c.mu.Unlock()
	}()
	select {
	case c.wake <- struct{}{}:
	default:
	}
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-ch:
		return nil
	}
}

// stop drains (within ctx) and stops the collector.
func (c *collector) stop(ctx context.Context) {
	_ = c.drain(ctx)
	c.mu.Lock()
	select {
	case <-c.stopped:
	default:
		close(c.stopped)
	}
	c.mu.Unlock()
	c.done.Wait()
}

func (c *collector) loop() {
	defer c.done.Done()
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	defer timer.Stop()
	for {
		select {
		case <-c.stopped:
			return
		case <-c.wake:
		case <-timer.C:
		}
		for {
			c.mu.Lock()
			var items, later []gcItem
			now := time.Now()
			for _, it := range c.queue {
				if c.hurry > 0 || !it.due.After(now) {
					items = append(items, it)
				} else {
					later = append(later, it)
				}
			}
			c.queue = later
			c.busy = len(items) > 0
			if !c.busy {
				if len(later) > 0 {
					// The queue is in due order: items are added with
					// due times that only grow.
					timer.Reset(time.Until(later[0].due))
				} else if !c.isIdle {
					close(c.idle)
					c.isIdle = true
				}
				c.mu.Unlock()
				break
			}
			c.mu.Unlock()
			ctx, cancel := context.WithTimeout(context.Background(), 10*c.b.timeout())
			c.round(ctx, items)
			cancel()
			c.mu.Lock()
			c.busy = false
			c.mu.Unlock()
		}
	}
}

// round collects items: per mailbox, one read-back of the head, then its
// items, mailboxes concurrently.
func (c *collector) round(ctx context.Context, items []gcItem) {
	by := map[store.ID][]gcItem{}
	var order []store.ID
	unmarks := map[int][][]byte{} // shard -> blobs
	c.mu.Lock()
	for _, it := range items {
		if it.kind == gcUnmark {
			unmarks[blobShard(it.blob)] = append(unmarks[blobShard(it.blob)], it.blob[:])
			continue
		}
		if c.gone[it.mailbox] {
			continue
		}
		if by[it.mailbox] == nil {
			order = append(order, it.mailbox)
		}
		by[it.mailbox] = append(by[it.mailbox], it)
	}
	c.mu.Unlock()
	sem := make(chan struct{}, 8)
	var wg sync.WaitGroup
	var mu sync.Mutex
	released := map[store.ID]gcItem{} // blob -> one of the holders let go
	for shard, blobs := range unmarks {
		for len(blobs) > 0 {
			n := min(len(blobs), maxUnmarks)
			ids := blobs[:n]
			blobs = blobs[n:]
			wg.Add(1)
			sem <- struct{}{}
			go func() {
				defer wg.Done()
				defer func() { <-sem }()
				if err := c.b.e.write(ctx, `DELETE FROM pending_blobs WHERE shard = ? AND id IN ?`, shard, ids).Exec(); err != nil {
					c.b.log.Warn("unmarking blobs failed; the reclaimer removes their marks later", "blobs", len(ids), "err", wrap("unmarking blobs", err))
				}
			}()
		}
	}
	for _, id := range order {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			rel, err := c.mailbox(ctx, id, by[id])
			if err != nil {
				c.b.log.Warn("collecting a mailbox's garbage; some stays", "mailbox", id, "err", err)
			}
			mu.Lock()
			for _, it := range rel {
				released[it.blob] = it
			}
			mu.Unlock()
		}()
	}
	wg.Wait()
	// Each blob once, after every reference this round let go is gone:
	// releases of one blob at once would each see the other's reference
	// and keep it.
	for blob, it := range released {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			if err := c.release(ctx, blob, it.mailbox, int64(it.uid)); err != nil {
				c.b.log.Warn("releasing a blob; it stays", "blob", blob, "err", err)
			}
		}()
	}
	wg.Wait()
}

// mailbox collects one mailbox's items and returns the expunges whose
// blobs are to be released.
func (c *collector) mailbox(ctx context.Context, id store.ID, items []gcItem) ([]gcItem, error) {
	b := c.b
	// At the read consistency (R + W > RF: it sees every head write
	// acknowledged at the write consistency), as ADR 0024 says: QUORUM.
	h, err := b.readHead(ctx, id, false)
	if isNotFound(err) {
		return nil, nil // deleted meanwhile: it took its rows along
	}
	if err != nil {
		return nil, err
	}
	m := b.mbox(id)
	defer b.unpin(m)
	var keep []gcItem
	for _, it := range items {
		// Only what a head of the batch's own epoch, at or above the
		// batch's, covers: such a head was read back, so no later epoch
		// had adopted the mailbox when it was.
		if h.written && h.epoch == it.epoch && h.HighestModSeq >= it.head {
			keep = append(keep, it)
		}
	}
	if len(keep) < len(items) {
		b.log.Warn("garbage of batches not covered by the head read back is left", "mailbox", id, "items", len(items)-len(keep), "head_epoch", h.epoch)
	}
	if len(keep) > 0 {
		_ = b.verified(m, keep[0].epoch, h) // a read-back is a verification too
	}
	var errs []error
	var released []gcItem
	var mu sync.Mutex
	note := func(err error) {
		if err != nil {
			mu.Lock()
			errs = append(errs, err)
			mu.Unlock()
		}
	}
	sem := make(chan struct{}, 16)
	var wg sync.WaitGroup
	spawn := func(f func() error) {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			note(f())
		}()
	}
	for _, it := range keep {
		switch it.kind {
		case gcPrune:
			continue // after the others
		case gcExpunged:
			spawn(func() error {
				err := c.expunged(ctx, id, it)
				if err == nil {
					mu.Lock()
					released = append(released, it)
					mu.Unlock()
				}
				return err
			})
		default:
			spawn(func() error { return c.collect(ctx, id, it) })
		}
	}
	wg.Wait()
	for _, it := range keep {
		if it.kind == gcPrune {
			note(c.prune(ctx, id, it))
		}
	}
	return released, errors.Join(errs...)
}

func (c *collector) collect(ctx context.Context, id store.ID, it gcItem) error {
	if it.kind != gcSuperseded {
		return nil
	}
	// The version rows from the superseded one up to the new one (versions
	// a fenced batch left in between go too), then the superseded change
	// log entry (for an addition, an entry only a keyspace written before
	// additions were derived holds, batchadded.go; the collector cannot
	// tell without a read, so it deletes in any case).
	e := c.b.e
	if err := e.write(ctx, `DELETE FROM bmessages USING TIMESTAMP ? WHERE mailbox = ? AND bucket = ? AND uid = ? AND modseq >= ? AND modseq < ?`,
		it.ts, id[:], bucketOf(uint64(it.uid)), int64(it.uid), int64(max(it.prev, 1)), int64(it.modseq)).Exec(); err != nil {
		return wrap("collecting superseded versions", err)
	}
	return wrap("collecting a superseded change", e.write(ctx, `DELETE FROM bchanges USING TIMESTAMP ? WHERE mailbox = ? AND bucket = ? AND section = 0 AND modseq = ? AND uid = ?`,
		it.ts, id[:], bucketOf(it.prev), int64(it.prev), int64(it.uid)).Exec())
}

// expunged deletes an expunged message's rows, then its last change log
// entry and its blob reference (its blob is released by the caller).
func (c *collector) expunged(ctx context.Context, id store.ID, it gcItem) error {
	e := c.b.e
	if err := e.write(ctx, `DELETE FROM bmessages USING TIMESTAMP ? WHERE mailbox = ? AND bucket = ? AND uid = ?`,
		it.ts, id[:], bucketOf(uint64(it.uid)), int64(it.uid)).Exec(); err != nil {
		return wrap("collecting an expunged message", err)
	}
	if err := e.write(ctx, `DELETE FROM bchanges USING TIMESTAMP ? WHERE mailbox = ? AND bucket = ? AND section = 0 AND modseq = ? AND uid = ?`,
		it.ts, id[:], bucketOf(it.prev), int64(it.prev), int64(it.uid)).Exec(); err != nil {
		return wrap("collecting an expunged message's change", err)
	}
	return wrap("deleting blob reference", e.write(ctx, `DELETE FROM blob_refs USING TIMESTAMP ? WHERE id = ? AND mailbox = ? AND uid = ?`,
		it.ts, it.blob[:], id[:], int64(it.uid)).Exec())
}

// prune forgets the expunges in (from, to] now that the floor is at to:
// first the rows of any of their messages still there (an expunge whose
// garbage a dead process had queued), then the entries.
func (c *collector) prune(ctx context.Context, id store.ID, it gcItem) error {
	e := c.b.e
	for bk := bucketOf(it.from + 1); it.from < it.to && bk <= bucketOf(it.to); bk++ {
		iter := e.read(ctx, `SELECT modseq, uid FROM bchanges WHERE mailbox = ? AND bucket = ? AND section = 1 AND modseq > ? AND modseq <= ?`,
			id[:], bk, int64(it.from), int64(it.to)).PageSize(1000).Iter()
		byBucket := map[int][]int64{}
		at := map[int64]uint64{}
		var ms, uid int64
		for iter.Scan(&ms, &uid) {
			byBucket[bucketOf(uint64(uid))] = append(byBucket[bucketOf(uint64(uid))], uid)
			at[uid] = uint64(ms)
		}
		if err := iter.Close(); err != nil {
			return wrap("reading expunges to forget", err)
		}
		for ub, uids := range byBucket {
			rows, err := c.b.readUIDs(ctx, id, ub, uids)
			if err != nil {
				return err
			}
			for _, r := range rows {
				if !r.present {
					continue
				}
				// Left by a lost collection: collect it now.
				x := gcItem{kind: gcExpunged, mailbox: id, ts: it.ts, uid: r.msg.UID, prev: r.msg.ModSeq, modseq: at[int64(r.msg.UID)], blob: r.msg.Blob}
				if err := c.expunged(ctx, id, x); err != nil {
					return err
				}
				for _, v := range r.versions {
					if err := e.write(ctx, `DELETE FROM bchanges USING TIMESTAMP ? WHERE mailbox = ? AND bucket = ? AND section = 0 AND modseq = ? AND uid = ?`,
						it.ts, id[:], bucketOf(v.modseq), int64(v.modseq), int64(r.msg.UID)).Exec(); err != nil {
						return wrap("collecting an expunged message's change", err)
					}
				}
				if err := c.release(ctx, r.msg.Blob, id, int64(r.msg.UID)); err != nil {
					return err
				}
			}
		}
		lo, hi := max(int64(bk)<<bucketBits, 1), int64(bk+1)<<bucketBits-1
		q := e.write(ctx, `DELETE FROM bchanges USING TIMESTAMP ? WHERE mailbox = ? AND bucket = ? AND section = 1 AND modseq > ? AND modseq <= ?`,
			it.ts, id[:], bk, int64(it.from), int64(it.to))
		if int64(it.from) < lo && hi <= int64(it.to) {
			q = e.write(ctx, `DELETE FROM bchanges USING TIMESTAMP ? WHERE mailbox = ? AND bucket = ? AND section = 1`, it.ts, id[:], bk)
		}
		if err := q.Exec(); err != nil {
			return wrap("forgetting expunges", err)
		}
	}
	return nil
}

// Sharing a blob in the batch mode, without a conditional write.
//
// A blob written with a batch (an inline body) is held by the message that
// stored it, named in the blob row (owner, owner_uid), with no blob_refs
// row; every other holder (a message appended with a blob stored by
// PutBlob, or copied or moved) has a blob_refs row written with its batch.
// A blob goes when its last holder is collected:
//
//	release (collector, after the holder's expunge was acknowledged):
//	  the holder's blob_refs row is deleted (owner: nothing to delete)
//	  read the refs and, if another message owns it, that message's row:
//	    a holder left -> keep the blob
//	  write a doom row (blob_refs row with a zero mailbox and a random
//	  negative uid, this releaser's own)
//	  read the refs again: a holder appeared -> delete the doom row, keep
//	  none -> delete the blob row, its chunks, its mark, then every
//	          blob_refs row of the blob (at tsForever)
//	append of a blob stored before (SubmitBatch, after the batch's rows):
//	  its blob_refs row is written with the rows
//	  read the refs: a doom row -> the batch fails, ErrNotFound
//	  read the blob row: missing -> ErrNotFound
//
// Both sides write, then read what the other writes (at the write and read
// consistencies, R + W > RF): a releaser that saw no holder doomed the
// blob before the appender read, so the appender fails; an appender that
// found no doom wrote its reference before the releaser read, so the
// releaser keeps the blob. Releasers never undo another's doom (each
// deletes only its own row), so two releasers need no conditional write to
// agree: both may delete, neither resurrects. A batch that also expunges a
// reference of the blob needs no check (that reference outlives the
// batch). Left over: the doom row of a releaser that died between its
// writes blocks appends of that blob (which had no holder when it was
// doomed); two releasers of one blob's last two holders in two processes
// at once may both see the other's holder and keep the blob (a leak that
// Check reports).

var zeroID store.ID

// intact reports ErrNotFound if blob is doomed or gone (the appender's
// read, after its reference was written).
func (c *collector) intact(ctx context.Context, blob store.ID) error {
	e := c.b.e
	it := e.read(ctx, `SELECT mailbox FROM blob_refs WHERE id = ?`, blob[:]).PageSize(1000).Iter()
	var mb []byte
	doomed := false
	for it.Scan(&mb) {
		if isZeroID(mb) {
			doomed = true
		}
	}
	if err := it.Close(); err != nil {
		return wrap("reading blob references", err)
	}
	if doomed {
		return fmt.Errorf("blob %s: %w (being released)", blob, store.ErrNotFound)
	}
	_, _, err := e.blobInfo(ctx, blob)
	return err
}

func isZeroID(b []byte) bool { return len(b) == len(zeroID) && store.ID(b) == zeroID }

// holders reports whether blob has a holder other than (mailbox, uid):
// a blob_refs row, or an owner message still there.
func (c *collector) holders(ctx context.Context, blob, mailbox store.ID, uid int64, owner []byte, ownerUID *int64) (bool, error) {
	e := c.b.e
	it := e.read(ctx, `SELECT mailbox, uid FROM blob_refs WHERE id = ?`, blob[:]).PageSize(1000).Iter()
	var mb []byte
	var u int64
	held := false
	for it.Scan(&mb, &u) {
		if !isZeroID(mb) && !(store.ID(mb) == mailbox && u == uid) {
			held = true
		}
	}
	if err := it.Close(); err != nil {
		return false, wrap("reading blob references", err)
	}
	if held || len(owner) != len(zeroID) || ownerUID == nil || (store.ID(owner) == mailbox && *ownerUID == uid) {
		return held, nil
	}
	var got int64
	err := e.read(ctx, `SELECT uid FROM bmessages WHERE mailbox = ? AND bucket = ? AND uid = ? AND modseq = 0`,
		owner, bucketOf(uint64(*ownerUID)), *ownerUID).Scan(&got)
	if err == nil {
		return true, nil
	}
	if isDriverNotFound(err) {
		return false, nil
	}
	return false, wrap("reading a blob's owner", err)
}

// release deletes blob if no message holds it any more, (mailbox, uid)
// having just let it go (see above).
func (c *collector) release(ctx context.Context, blob, mailbox store.ID, uid int64) error {
	e := c.b.e
	var size int64
	var chunks int
	var owner []byte
	var ownerUID *int64
	err := e.read(ctx, `SELECT size, chunks, owner, owner_uid FROM blobs WHERE id = ?`, blob[:]).Scan(&size, &chunks, &owner, &ownerUID)
	if isDriverNotFound(err) {
		return nil
	}
	if err != nil {
		return wrap("reading blob", err)
	}
	if held, err := c.holders(ctx, blob, mailbox, uid, owner, ownerUID); err != nil || held {
		return err
	}
	doom := -1 - rand.Int64N(1<<62)
	if err := e.write(ctx, `INSERT INTO blob_refs (id, mailbox, uid) VALUES (?, ?, ?)`, blob[:], zeroID[:], doom).Exec(); err != nil {
		return wrap("dooming blob", err)
	}
	held, err := c.holders(ctx, blob, mailbox, uid, nil, nil)
	if err != nil || held {
		if derr := e.write(ctx, `DELETE FROM blob_refs WHERE id = ? AND mailbox = ? AND uid = ?`, blob[:], zeroID[:], doom).Exec(); derr != nil {
			err = errors.Join(err, wrap("undooming blob", derr))
		}
		return err
	}
	if err := e.deleteBlob(ctx, blob, max(chunks, 0)); err != nil {
		return err
	}
	return wrap("deleting blob references", e.write(ctx, `DELETE FROM blob_refs USING TIMESTAMP ? WHERE id = ?`, tsForever, blob[:]).Exec())
}

// gcWait bounds Check's wait for the collector.
const gcWait = time.Minute
