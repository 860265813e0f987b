package cassandra

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	gocql "github.com/apache/cassandra-gocql-driver/v2"

	"quill/internal/store"
)

// A mailbox mutation, outlined (see also the package comment):
//
//	loop:
//	  h := read head                       (LOCAL_QUORUM)
//	  if h.pending: wait, or roll it forward once older than RollForwardAfter
//	  o := plan(h)                         (reads rows as of h: final, see below)
//	  LWT: head := h + o, pending = o  IF pending = null AND modseq = h.modseq AND uidnext = h.uidnext
//	  not applied: back off, loop
//	apply(o)   idempotent writes stamped USING TIMESTAMP o.ModSeq
//	LWT: pending = null IF pending = o
//
// Rows are final as of a head without a pending operation: the operation
// that produced that head cleared its pending mark only after its rows were
// written at the write consistency. Stamping every row write with the
// operation's MODSEQ makes a late duplicate write (the slow original after a
// roll-forward) lose to every later operation's write of the same cell.
//
// Rejected: counters as static columns of the message partition with the row
// insert and the counter bump in one conditional batch (one LWT per append
// instead of two). It orders appends, but a flag change or expunge of a
// message in an older UID bucket must bump the same MODSEQ counter, which
// lives in another partition, so no single-partition batch can make both
// visible atomically. See docs/adr/0006-cassandra-engine.md.

type opKind uint8

const (
	opAppend opKind = iota + 1
	opFlags
	opExpunge
)

// counters are a head's columns that an operation's LWT sets. Floor is
// the expunge floor (store.Mailbox.ExpungeFloor).
type counters struct {
	UIDNext, ModSeq, Messages, Size int64
	Floor                           int64 `json:",omitempty"`
}

// opMsg is one message an operation touches. OldModSeq locates the change
// log row the operation supersedes (flags and expunge).
type opMsg struct {
	UID       uint32
	OldModSeq uint64    `json:",omitempty"`
	Flags     []string  `json:",omitempty"`
	Date      time.Time `json:",omitzero"`
	Size      int64     `json:",omitempty"`
	Blob      store.ID
	Meta      []byte `json:",omitempty"`
}

// op is a mailbox mutation as recorded in the head while it is applied.
type op struct {
	ID      store.ID
	Kind    opKind
	ModSeq  uint64
	Started time.Time
	Before  counters
	After   counters
	Msgs    []opMsg
}

func decodeOp(b []byte) (*op, error) {
	var o op
	if err := json.Unmarshal(b, &o); err != nil {
		return nil, fmt.Errorf("cassandra: undecodable pending operation: %w", err)
	}
	return &o, nil
}

// recentOps is how many operation IDs the head remembers, to resolve an LWT
// whose outcome the client did not learn (timeout).
const recentOps = 16

// maxAttempts bounds the optimistic loop of one mutation.
const maxAttempts = 2000

// settleFor bounds how long a writer keeps trying to apply an operation
// it committed, or to learn whether its LWT committed, before its caller
// is told the outcome is unknown: long enough to outlive a coordinator
// that died under the write (the driver marks it down and the next
// attempt goes to another node), short next to a client's patience. The
// caller's deadline, if sooner, ends it first.
const settleFor = 10 * time.Second

// errAmbiguous: a mailbox update may have committed and will then be
// applied, by its writer or by the next writer's roll-forward.
var errAmbiguous = fmt.Errorf("cassandra: outcome of the mailbox update unknown: %w", store.ErrOutcomeUnknown)

// settle calls try until it succeeds, stop says its error is final, ctx
// ends or settleFor has passed since since, backing off from 10 ms to
// 500 ms with jitter between attempts. It returns try's last error.
func settle(ctx context.Context, since time.Time, stop func(error) bool, try func() error) error {
	wait := 10 * time.Millisecond
	for {
		err := try()
		if err == nil || (stop != nil && stop(err)) || time.Since(since)+wait > settleFor {
			return err
		}
		t := time.NewTimer(wait/2 + rand.N(wait/2+1))
		select {
		case <-ctx.Done():
			t.Stop()
			return err
		case <-t.C:
		}
		wait = min(2*wait, 500*time.Millisecond)
	}
}

// mutate runs one mailbox mutation; plan returns nil when there is nothing
// to change. It returns the operation as committed and applied.
func (e *Engine) mutate(ctx context.Context, id store.ID, plan func(h head) (*op, error)) (*op, error) {
	for attempt := 0; ; attempt++ {
		if attempt >= maxAttempts {
			return nil, fmt.Errorf("%w: mailbox %s too contended", store.ErrConflict, id)
		}
		h, err := e.readHead(ctx, id, false)
		if err != nil {
			return nil, err
		}
		if h.pending != nil {
			if time.Since(h.pending.Started) > e.opts.RollForwardAfter {
				e.log.Info("rolling forward a stalled mailbox operation", "mailbox", id, "modseq", h.pending.ModSeq)
				if err := e.finish(ctx, id, h.pending, h.pendingRaw); err != nil {
					return nil, err
				}
				continue
			}
			if err := backoff(ctx, attempt); err != nil {
				return nil, err
			}
			continue
		}
		o, err := plan(h)
		if err != nil || o == nil {
			return nil, err
		}
		o.ID, o.Started, o.ModSeq = store.NewID(), time.Now(), uint64(h.modSeq)+1
		o.Before = counters{UIDNext: h.uidNext, ModSeq: h.modSeq, Messages: h.messages, Size: h.size, Floor: h.floor}
		o.After.ModSeq, o.After.Floor = int64(o.ModSeq), h.floor
		if o.Kind == opExpunge {
			o.After.Floor = e.raisedFloor(h.floor, o.After.ModSeq)
		}
		raw, err := json.Marshal(o)
		if err != nil {
			return nil, err
		}
		recent := append([][]byte{o.ID[:]}, h.recent...)
		if len(recent) > recentOps {
			recent = recent[:recentOps]
		}
		applied, err := e.cas(ctx, `UPDATE mailboxes SET uidnext = ?, modseq = ?, messages = ?, size = ?, expunge_floor = ?, pending = ?, recent = ?
			WHERE id = ? IF pending = null AND modseq = ? AND uidnext = ?`,
			o.After.UIDNext, o.After.ModSeq, o.After.Messages, o.After.Size, o.After.Floor, raw, recent,
			id[:], h.modSeq, h.uidNext).MapScanCAS(map[string]any{})
		if err != nil {
			applied, err = e.resolve(ctx, id, o, err)
			if err != nil {
				return nil, err
			}
		}
		if !applied {
			if err := backoff(ctx, attempt); err != nil {
				return nil, err
			}
			continue
		}
		// Committed, so decided: it will be applied, by this writer or
		// by the next one's roll-forward. Applying it again after a
		// failure is safe (every write of finish is idempotent), and the
		// usual failure is a coordinator that died under the write, which
		// the next attempt does not use. Giving up leaves an outcome the
		// caller cannot know, though the change will become visible.
		err = settle(ctx, o.Started, nil, func() error { return e.finish(ctx, id, o, raw) })
		if err != nil {
			// Committed but not yet applied: the next writer of this
			// mailbox applies it after RollForwardAfter.
			return nil, fmt.Errorf("%w: committed at MODSEQ %d, applying: %w", errAmbiguous, o.ModSeq, err)
		}
		return o, nil
	}
}

// resolve learns whether o's LWT, which failed with cause, was applied. A
// serial read completes or supersedes any Paxos round in progress, so the
// head it returns is final with respect to o; it is retried like finish
// (settle). Failing that, or when o has left the head's recent list, the
// outcome is unknown (errAmbiguous).
func (e *Engine) resolve(ctx context.Context, id store.ID, o *op, cause error) (bool, error) {
	var h head
	err := settle(ctx, o.Started, isNotFound, func() (err error) {
		h, err = e.readHead(ctx, id, true)
		return err
	})
	if err != nil {
		return false, fmt.Errorf("%w: %w (then %w)", errAmbiguous, cause, err)
	}
	for _, r := range h.recent {
		if bytes.Equal(r, o.ID[:]) {
			return true, nil
		}
	}
	if h.modSeq-o.Before.ModSeq < recentOps {
		return false, nil // it would still be listed in recent
	}
	return false, fmt.Errorf("%w: %w", errAmbiguous, cause)
}

// finish applies o's rows and clears it from the head.
func (e *Engine) finish(ctx context.Context, id store.ID, o *op, raw []byte) error {
	if err := e.apply(ctx, id, o); err != nil {
		return err
	}
	// Clearing is idempotent (a repeat finds pending already null and does
	// nothing), so unlike other LWTs it is retried after any error.
	_, err := e.cas(ctx, `UPDATE mailboxes SET pending = null WHERE id = ? IF pending = ?`, id[:], raw).
		RetryPolicy(retryIdempotent).MapScanCAS(map[string]any{})
	return wrap("clearing pending operation", err)
}

func bucketOf(n uint64) int { return int(n >> bucketBits) }

// apply writes the rows o implies. Every write is idempotent and stamped
// with o.ModSeq; rows of one message partition go in one unlogged batch.
func (e *Engine) apply(ctx context.Context, id store.ID, o *op) error {
	ts := int64(o.ModSeq)
	batches := map[int]*gocql.Batch{}
	var order []int
	batch := func(uid uint32) *gocql.Batch {
		b := bucketOf(uint64(uid))
		if batches[b] == nil {
			batches[b] = e.s.Batch(gocql.UnloggedBatch).Consistency(e.opts.WriteConsistency).WithTimestamp(ts).WithContext(ctx)
			order = append(order, b)
		}
		return batches[b]
	}
	changes := e.s.Batch(gocql.UnloggedBatch).Consistency(e.opts.WriteConsistency).WithTimestamp(ts).WithContext(ctx)
	var refs []*gocql.Query
	var released []store.ID
	m := id[:]
	cb := bucketOf(o.ModSeq)
	for _, msg := range o.Msgs {
		uid := int64(msg.UID)
		b := bucketOf(uint64(msg.UID))
		switch o.Kind {
		case opAppend:
			batch(msg.UID).Query(`INSERT INTO messages (mailbox, bucket, uid, modseq, flags, internal_date, size, blob, meta) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)`,
				m, b, uid, ts, joinFlags(msg.Flags), msg.Date, msg.Size, msg.Blob[:], msg.Meta)
			changes.Query(`INSERT INTO changes (mailbox, bucket, modseq, uid, kind) VALUES (?, ?, ?, ?, ?)`, m, cb, ts, uid, int8(store.ChangeAdded))
			refs = append(refs, e.write(ctx, `INSERT INTO blob_refs (id, mailbox, uid) VALUES (?, ?, ?)`, msg.Blob[:], m, uid).WithTimestamp(ts))
		case opFlags:
			batch(msg.UID).Query(`UPDATE messages SET flags = ?, modseq = ? WHERE mailbox = ? AND bucket = ? AND uid = ?`,
				joinFlags(msg.Flags), ts, m, b, uid)
			changes.Query(`INSERT INTO changes (mailbox, bucket, modseq, uid, kind) VALUES (?, ?, ?, ?, ?)`, m, cb, ts, uid, int8(store.ChangeFlags))
		case opExpunge:
			batch(msg.UID).Query(`DELETE FROM messages WHERE mailbox = ? AND bucket = ? AND uid = ?`, m, b, uid)
			changes.Query(`INSERT INTO changes (mailbox, bucket, modseq, uid, kind) VALUES (?, ?, ?, ?, ?)`, m, cb, ts, uid, int8(store.ChangeExpunged))
			refs = append(refs, e.write(ctx, `DELETE FROM blob_refs WHERE id = ? AND mailbox = ? AND uid = ?`, msg.Blob[:], m, uid).WithTimestamp(ts))
			released = append(released, msg.Blob)
		}
		if o.Kind != opAppend {
			// The superseded change log row (one row per UID).
			refs = append(refs, e.write(ctx, `DELETE FROM changes WHERE mailbox = ? AND bucket = ? AND modseq = ? AND uid = ?`,
				m, bucketOf(msg.OldModSeq), int64(msg.OldModSeq), uid).WithTimestamp(ts))
		}
	}
	for _, b := range order {
		if err := e.s.ExecuteBatch(batches[b]); err != nil {
			return wrap("writing messages", err)
		}
	}
	if err := e.s.ExecuteBatch(changes); err != nil {
		return wrap("writing change log", err)
	}
	if err := e.pruneChanges(ctx, id, o.Before.Floor, o.After.Floor, ts); err != nil {
		return err
	}
	for _, q := range refs {
		if err := q.Exec(); err != nil {
			return wrap("writing references", err)
		}
	}
	if o.Kind == opAppend {
		for _, msg := range o.Msgs {
			if err := e.write(ctx, `DELETE FROM pending_blobs WHERE shard = ? AND id = ?`, blobShard(msg.Blob), msg.Blob[:]).Exec(); err != nil {
				return wrap("unmarking blob", err)
			}
		}
	}
	seen := map[store.ID]bool{}
	for _, b := range released {
		if !seen[b] {
			seen[b] = true
			if err := e.releaseBlob(ctx, b); err != nil {
				return err
			}
		}
	}
	return nil
}

// pruneBuckets bounds how many change log partitions one expunge deletes,
// so a mailbox with a long history forgets it over its next expunges.
const pruneBuckets = 64

// raisedFloor is the expunge floor after an expunge at MODSEQ m in a
// mailbox whose floor is floor. Once the log holds 2·ExpungeWindow MODSEQs
// above the floor, the floor rises to m - ExpungeWindow, by at most
// pruneBuckets partitions: the window is always kept, and the pruning is
// paid once per ExpungeWindow MODSEQs rather than by every expunge.
func (e *Engine) raisedFloor(floor, m int64) int64 {
	w := int64(e.opts.ExpungeWindow)
	if m < floor+2*w {
		return floor
	}
	limit := int64(bucketOf(uint64(floor)+1)+pruneBuckets)<<bucketBits - 1
	return min(m-w, limit)
}

// pruneChanges deletes the change log rows with MODSEQ in (from, to]: a
// whole partition where the range covers it, else a range of rows. The
// head's floor was raised to to by the operation's LWT, before any row
// goes, so a reader that misses a row finds the floor raised (Changes).
// Every row covered was written at its own MODSEQ, below ts, so the
// deletes win over a late duplicate write, and repeating them (a
// roll-forward) is harmless.
func (e *Engine) pruneChanges(ctx context.Context, id store.ID, from, to int64, ts int64) error {
	for b := bucketOf(uint64(from) + 1); from < to && b <= bucketOf(uint64(to)); b++ {
		lo, hi := max(int64(b)<<bucketBits, 1), int64(b+1)<<bucketBits-1
		q := e.write(ctx, `DELETE FROM changes WHERE mailbox = ? AND bucket = ? AND modseq > ? AND modseq <= ?`, id[:], b, from, to)
		if from < lo && hi <= to {
			q = e.write(ctx, `DELETE FROM changes WHERE mailbox = ? AND bucket = ?`, id[:], b)
		}
		if err := q.WithTimestamp(ts).Exec(); err != nil {
			return wrap("pruning change log", err)
		}
	}
	return nil
}

// backoff sleeps before the next optimistic attempt: exponential from
// 1 ms to 64 ms with full jitter, so contenders spread out.
func backoff(ctx context.Context, attempt int) error {
	d := time.Millisecond << min(attempt, 6)
	t := time.NewTimer(time.Duration(rand.Int64N(int64(d)) + int64(time.Millisecond)))
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

func isNotFound(err error) bool { return errors.Is(err, store.ErrNotFound) }
func isExists(err error) bool   { return errors.Is(err, store.ErrExists) }
func isDriverNotFound(err error) bool {
	return errors.Is(err, gocql.ErrNotFound)
}
