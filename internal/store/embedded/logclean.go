package embedded

import (
	"cmp"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/cockroachdb/pebble/v2"

	"quill/internal/store"
	"quill/internal/store/embedded/bodylog"
)

const (
	// defaultSegmentBytes is the size at which the log moves to a new
	// segment: large enough that rotations (a file creation and a
	// directory sync) are rare, small enough that one segment's garbage is
	// a modest share of the disk.
	defaultSegmentBytes = 64 << 20
	// cleanAfterSegments is how many reclaimable segments may wait for a
	// flush before the cleaner forces one: forcing one per segment would
	// multiply Pebble's flushes.
	cleanAfterSegments = 4
	// logIndexBlobs is Options.LogIndexBlobs's default: at 4 KiB a body,
	// the newest 8 GiB of live mail.
	logIndexBlobs = 2 << 20
	// moveBatchBytes bounds the bodies one cleaning transaction copies
	// forward: the commit group that carries them writes and syncs them
	// before it answers the deliveries it holds, so a large one shows in
	// their latency.
	moveBatchBytes = 512 << 10
)

// countLive counts every segment's live bytes from the blob records, finds
// the frozen segments (those with log index entries in Pebble) and
// rebuilds the others' in-memory index; at open, before the committer
// starts.
func (e *Engine) countLive() error {
	if err := e.checkpoint("open"); err != nil {
		return err
	}
	frozen := map[uint32]bool{}
	it, err := e.db.NewIter(&pebble.IterOptions{LowerBound: []byte{tLogged}, UpperBound: []byte{tLogged + 1}})
	if err != nil {
		return err
	}
	for ok := it.First(); ok; {
		k := it.Key()
		if len(k) != 1+4+16 {
			it.Close()
			return fmt.Errorf("embedded: log index entry %x: %w", k, errCorrupt)
		}
		seg := binary.BigEndian.Uint32(k[1:5])
		frozen[seg] = true
		ok = it.SeekGE(loggedPrefix(seg + 1))
	}
	if err := errors.Join(it.Error(), it.Close()); err != nil {
		return err
	}
	// The frozen segments first, so that the blobs in them stay out of
	// the in-memory index.
	var deltas []bodylog.Delta
	for id := range frozen {
		deltas = append(deltas, bodylog.Delta{Seg: id, Freeze: true})
	}
	it, err = e.db.NewIter(&pebble.IterOptions{LowerBound: []byte{tBlob}, UpperBound: []byte{tBlob + 1}})
	if err != nil {
		return err
	}
	defer it.Close()
	for it.First(); it.Valid(); it.Next() {
		k := it.Key()
		var id store.ID
		if len(k) != 1+len(id) {
			return fmt.Errorf("embedded: blob record key %x: %w", k, errCorrupt)
		}
		r, err := decodeBlob(it.Value())
		if err != nil {
			return fmt.Errorf("embedded: blob record %x: %w", k, err)
		}
		if r.Seg == 0 {
			continue // in chunks (schema level 1)
		}
		copy(id[:], k[1:])
		deltas = append(deltas, bodylog.Delta{Seg: r.Seg, Bytes: r.Size, Blob: id, Add: true})
	}
	if err := it.Error(); err != nil {
		return err
	}
	e.blog.AddLive(deltas)
	return nil
}

// cleanLoop reclaims the log's space whenever the log moves to a new
// segment, and once a minute in case deliveries have stopped.
func (e *Engine) cleanLoop() {
	defer e.wg.Done()
	tick := time.NewTicker(time.Minute)
	defer tick.Stop()
	for {
		var err error
		select {
		case <-e.quit:
			return
		case <-e.blog.Wake():
			err = e.cleanLog(false)
		case <-tick.C:
			err = e.cleanLog(true)
		}
		if err != nil && !errors.Is(err, ErrClosed) {
			e.log.Warn("cleaning the body log", "err", err)
		}
	}
}

// cleanLog makes one pass over the sealed segments: it deletes those that
// no blob points into and, while the log is over its space budget
// (cleanPlan), copies forward the live bodies of the segments that repay
// it best so that they can be deleted next. Either needs Pebble's tables to
// hold the segment's records; when at least cleanAfterSegments reclaimable
// segments (or, with force, any) wait for that, it flushes.
func (e *Engine) cleanLog(force bool) error {
	l := e.blog
	e.cleaning.Lock()
	defer e.cleaning.Unlock()
	var sealed []*bodylog.Segment
	var young []bodylog.SegmentInfo // in order (Segments)
	indexed := 0                    // blobs in young segments' indexes
	for _, s := range l.Segments() {
		indexed += s.Blobs
		if s.Sealed {
			sealed = append(sealed, s.Seg)
			if !s.Frozen {
				young = append(young, s)
			}
		}
	}
	for _, s := range young {
		if indexed <= e.opts.LogIndexBlobs {
			break
		}
		indexed -= l.Info(s.Seg).Blobs
		if err := e.freeze(s.Seg); err != nil {
			return err
		}
	}
	reclaimable := cleanPlan(l.Segments(), e.opts.LogSegmentBytes)
	waiting := 0
	for _, s := range reclaimable {
		if !s.Flushed {
			waiting++
		}
	}
	if waiting > 0 && (force || waiting >= cleanAfterSegments) {
		// Every record of a sealed segment was in the overlay before it
		// was sealed (the log moves to a new segment between groups),
		// so this checkpoint applies them all and the flush puts them in
		// tables, with a log position past the segment.
		if err := e.checkpoint("clean"); err != nil {
			return err
		}
		if err := e.flush(); err != nil {
			return err
		}
		l.SetFlushed(sealed)
	}
	for _, s := range reclaimable {
		now := l.Info(s.Seg)
		if !now.Flushed {
			continue
		}
		if now.Live > 0 {
			if e.space.full.Load() {
				continue // moving bodies needs space (space.go)
			}
			if err := e.moveLive(s.Seg); err != nil {
				return err
			}
		}
		if err := e.dropSegment(s.Seg); err != nil {
			return err
		}
	}
	return nil
}

// cleanBudget is the log's space budget as a multiple of its live bytes:
// the cleaner copies bodies forward only while the log is larger than
// cleanBudget times the bodies that messages reference, plus one segment.
//
// Cleaning every segment as soon as it was half dead, as the cleaner first
// did, copied the same bodies again and again under the Porcupine mix: mail
// for users who rarely retrieve it outlives the mail around it, so each
// segment fell below half live within seconds, its survivors were copied
// into the head of the log among new mail that dies as fast, and that
// segment soon fell below half live in turn. The cleaner copied 150-430 MB
// of bodies per 10 s run in which 420 MB were delivered. Waiting until the
// space is needed lets segments empty further first, and the segments
// chosen (cleanPlan) are those whose survivors have already proved long
// lived, so that they are copied once (the cost-benefit policy of
// log-structured file systems).
const cleanBudget = 2

// cleanPlan returns the sealed segments to reclaim, oldest first: every
// one that no live body is counted in, and, while the log exceeds its
// budget, those of less than half live bytes in order of (1-u)*age/(1+u),
// where u is the live share and age the segments written since (the space
// freed, weighted by how long its survivors have lasted, per byte read and
// rewritten). segs are the log's segments as of one moment
// (bodylog.Log.Segments).
func cleanPlan(segs []bodylog.SegmentInfo, segBytes int64) []bodylog.SegmentInfo {
	var total, live int64
	var cur uint32 // the newest segment
	var plan, candidates []bodylog.SegmentInfo
	for _, s := range segs {
		cur = max(cur, s.ID)
		total += s.Size
		live += s.Live
		switch {
		case !s.Sealed:
		case s.Live == 0:
			plan = append(plan, s)
			total -= s.Size
		case 2*s.Live < s.Size:
			candidates = append(candidates, s)
		}
	}
	score := func(s bodylog.SegmentInfo) float64 {
		u := float64(s.Live) / float64(s.Size)
		return (1 - u) * float64(cur-s.ID) / (1 + u)
	}
	slices.SortFunc(candidates, func(a, b bodylog.SegmentInfo) int { return cmp.Compare(score(b), score(a)) })
	for _, s := range candidates {
		if total <= cleanBudget*live+segBytes {
			break
		}
		plan = append(plan, s)
		total -= s.Size - s.Live // its live bodies move to the head
	}
	slices.SortFunc(plan, func(a, b bodylog.SegmentInfo) int { return cmp.Compare(a.ID, b.ID) })
	return plan
}

// dropSegment deletes a sealed, flushed segment if its log index lists no
// blob. The index decides, not the live bytes.
func (e *Engine) dropSegment(s *bodylog.Segment) error {
	ids, err := e.segmentBlobs(s)
	if err != nil || len(ids) > 0 {
		return err
	}
	return e.blog.Remove(s)
}

// segmentBlobs returns the blobs s's log index lists: those in memory and,
// if s is frozen, its entries in Pebble, whose deletions (moveLive's among
// them) may still be in the overlay.
func (e *Engine) segmentBlobs(s *bodylog.Segment) ([]store.ID, error) {
	ids, frozen := e.blog.YoungBlobs(s)
	if !frozen {
		return ids, nil
	}
	p := loggedPrefix(s.ID())
	it, _, err := e.spanView(segSpan(s.ID()), p, prefixEnd(p), nil, false)
	if err != nil {
		return nil, err
	}
	for ok := it.First(); ok; ok = it.Next() {
		var id store.ID
		copy(id[:], it.Key()[len(p):])
		ids = append(ids, id)
	}
	return ids, errors.Join(it.Error(), it.Close())
}

// freeze moves the log index of sealed segment s from memory into Pebble:
// one transaction writes an entry for each blob still in s, and from then
// on the transaction that drops or moves such a blob deletes its entry
// (txn.dropBlob, moveLive). Blobs dropped or moved by the group's earlier
// transactions, whose changes have not yet reached s's in-memory index,
// are read as they now are (txn.blob) and left out.
func (e *Engine) freeze(s *bodylog.Segment) error {
	return e.update(context.Background(), func(t *txn) error {
		ids, frozen := e.blog.YoungBlobs(s)
		if frozen {
			return nil
		}
		for _, id := range ids {
			r, err := t.blob(id)
			if errors.Is(err, store.ErrNotFound) {
				continue
			}
			if err != nil {
				return err
			}
			if r.Seg == s.ID() {
				t.insert(loggedKey(s.ID(), id), binary.AppendVarint(nil, r.Size))
			}
		}
		// The group's later transactions must delete the entries
		// written here (StartFreeze); the in-memory index goes only
		// once they are durable (AddLive), so that a group that fails
		// leaves it whole.
		e.blog.StartFreeze(s)
		t.deltas = append(t.deltas, bodylog.Delta{Seg: s.ID(), Freeze: true})
		return nil
	})
}

// moveLive copies the bodies that still live in segment s into the current
// segment and points their blob records there, through the committer.
func (e *Engine) moveLive(s *bodylog.Segment) error {
	type live struct {
		id   store.ID
		off  int64
		body []byte
	}
	ids, err := e.segmentBlobs(s)
	if err != nil {
		return err
	}
	var batch []live
	var bytes int64
	// arena holds the batch's bodies back to back. The committer copies
	// them into the log record before update returns (update waits for the
	// outcome of a queued transaction), so it and batch are reused
	// for the next batch.
	var arena []byte
	flush := func() error {
		if len(batch) == 0 {
			return nil
		}
		moving := batch
		batch, bytes, arena = batch[:0], 0, arena[:0]
		var moved int64
		err := e.update(context.Background(), func(t *txn) error {
			for _, m := range moving {
				r, err := t.blob(m.id)
				if errors.Is(err, store.ErrNotFound) {
					continue // expunged meanwhile
				}
				if err != nil {
					return err
				}
				if r.Seg != s.ID() || r.Off != m.off {
					continue
				}
				t.deltas = append(t.deltas, bodylog.Delta{Seg: s.ID(), Bytes: r.Size, Blob: m.id})
				if t.e.blog.IsFrozen(s.ID()) {
					t.del(loggedKey(s.ID(), m.id))
				}
				r.Seg, r.Off = t.e.blog.AddBody(m.body)
				t.set(blobKey(m.id), encodeBlob(r))
				t.deltas = append(t.deltas, bodylog.Delta{Seg: r.Seg, Bytes: r.Size, Blob: m.id, Add: true})
				moved += r.Size
			}
			return nil
		})
		if err == nil {
			e.blog.AddMoved(moved)
		}
		return err
	}
	for _, id := range ids {
		r, err := e.committedBlob(id)
		if errors.Is(err, store.ErrNotFound) {
			continue
		}
		if err != nil {
			return err
		}
		if r.Seg != s.ID() {
			continue
		}
		start := len(arena)
		arena = slices.Grow(arena, int(r.Size))[:start+int(r.Size)]
		body := arena[start:]
		if n, err := s.ReadAt(body, r.Off); int64(n) < r.Size {
			return fmt.Errorf("blob %s: short in log segment %s: %v: %w", id, bodylog.SegName(s.ID()), err, errCorrupt)
		}
		batch = append(batch, live{id, r.Off, body})
		if bytes += r.Size; bytes >= moveBatchBytes {
			if err := flush(); err != nil {
				return err
			}
		}
	}
	return flush()
}
