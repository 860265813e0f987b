package embedded

import (
	"encoding/binary"
	"errors"
	"fmt"
	"time"

	"github.com/cockroachdb/pebble/v2"

	"quill/internal/store"
	"quill/internal/store/embedded/overlay"
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
//     range (overlay.Touches), which under load is rare for all but the mailboxes
//     being written.
//
// A group that deletes a key range (deleting a mailbox or a user) is
// applied to Pebble directly, after the overlay: the overlay holds only
// point writes.
//
// The overlay itself, the net effect per key of the groups it holds, is
// package overlay; what it knows of the key layout is keySchema.

// Checkpoint defaults (Options.CheckpointInterval, CheckpointBytes).
const (
	checkpointInterval = 5 * time.Second
	checkpointBytes    = 64 << 20
)

// span names records that are iterated together: one mailbox's message,
// change and mailbox records, or one frozen log segment's index entries.
type span struct {
	box store.ID
	seg uint32
	log bool
}

func boxSpan(id store.ID) span { return span{box: id} }
func segSpan(seg uint32) span  { return span{seg: seg, log: true} }

// key returns the overlay's name for s, the span keySchema puts s's keys
// in.
func (s span) key() overlay.Span {
	if s.log {
		var seg [4]byte
		binary.BigEndian.PutUint32(seg[:], s.seg)
		return overlay.MakeSpan(tLogged, seg[:])
	}
	return overlay.MakeSpan(tMailbox, s.box[:])
}

// keySchema is the key layout (codec.go) as the overlay needs it: a
// mailbox's message, change and mailbox records make one span, read
// together through spanView, as do a frozen log segment's index entries;
// names and reverse aliases are listed per user; usage, blob, log
// position, version and secret records are never iterated outside Check,
// which settles regardless; every other table is iterated only after
// settling (settle).
var keySchema = func() *overlay.Schema {
	s := new(overlay.Schema)
	s.Spans(tMailbox, len(store.ID{}), tMessage, tChange, tMailbox)
	s.Spans(tLogged, 4, tLogged)
	s.ByUser(tName, tAliasOf)
	s.Untracked(tUsage, tBlob, tLogPos, tVersion, tSecret)
	return s
}()

// checkpoint applies the overlay's net effect to Pebble, with the log
// position of the last group it covers, and then forgets it. Any goroutine
// may call it; readers call it to settle before iterating Pebble.
func (e *Engine) checkpoint(reason string) error {
	return e.pend.Checkpoint(func(l *overlay.Layer) error {
		start := time.Now()
		// Sized for the whole layer (a record's header is at most 11
		// bytes, the batch's 12): grown by doubling, a batch of 20-30 MB
		// allocated twice that.
		b := e.db.NewBatchWithSize(l.Bytes() + 11*l.Live() + 12)
		defer b.Close()
		var err error
		ws := l.Writes()
		for i := range ws {
			p := &ws[i]
			if p.Cancelled() {
				continue
			}
			if p.Del {
				err = b.Delete(p.Key, nil)
			} else {
				err = b.Set(p.Key, p.Value, nil)
			}
			if err != nil {
				break
			}
		}
		if err == nil {
			err = b.Commit(pebble.NoSync)
		}
		if err != nil {
			// The overlay keeps the layer, so readers still see every
			// acknowledged write; the committer refuses further groups
			// (commitGroup).
			return fmt.Errorf("embedded: checkpoint: %w", err)
		}
		e.checkpointsBy.WithLabelValues(reason).Inc()
		e.ckptSeconds.Observe(time.Since(start).Seconds())
		return nil
	})
}

// settle makes Pebble hold every write the overlay holds for prefix p, so
// that an iteration of Pebble alone sees every acknowledged write in it.
func (e *Engine) settle(p []byte) error {
	if !e.pend.Touches(p) {
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
		if !e.pend.Due(e.opts.CheckpointInterval, e.opts.CheckpointBytes) {
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
	if v, ok := e.pend.Lookup(k); ok {
		if v == nil {
			return nil, store.ErrNotFound
		}
		return v, nil
	}
	return e.get(e.db, k)
}

// spanView opens a consistent view of sp's records in [lo, hi): an
// iterator over Pebble and the overlay's writes above it, taken under one
// read lock so that no checkpoint moves a write between them
// (overlay.Snapshot). above, if not nil, holds newer writes still (a
// commit group's) that override both. With withMailbox (a mailbox's span)
// it also returns the mailbox's record as of the view (nil if there is
// none).
func (e *Engine) spanView(sp span, lo, hi []byte, above map[string][]byte, withMailbox bool) (v *overlay.View, mbox []byte, err error) {
	mk := mailboxKey(sp.box)
	var it *pebble.Iterator
	ov, mbox, found := e.pend.Snapshot(sp.key(), lo, hi, mk, func() {
		it, err = e.db.NewIter(&pebble.IterOptions{LowerBound: mk, UpperBound: append(mk[:len(mk):len(mk)], 0)})
	})
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
	return overlay.NewView(it, overlay.WithAbove(ov, above, lo, hi)), mbox, nil
}
