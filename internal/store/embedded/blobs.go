package embedded

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"sync"
	"time"

	"quill/internal/store"
	"quill/internal/store/embedded/bodylog"
)

// chunkSize is the unit in which bodies are stored and read: large enough
// that a typical message is one key, small enough to keep Pebble values and
// read amplification modest for large ones.
const chunkSize = 256 << 10

// ErrTooLarge is wrapped by PutBlob when the body exceeds maxSize.
var ErrTooLarge = errors.New("embedded: blob larger than allowed")

// chunkBufs recycles the chunk-sized read buffers of PutBlob: allocating
// and zeroing 256 KiB per delivered message showed up in profiles.
var chunkBufs = sync.Pool{New: func() any { b := make([]byte, chunkSize); return &b }}

// newBlobID returns a blob ID whose first 8 bytes are the creation time,
// big-endian, and whose last 8 are random: bodies are the bulk of the
// database, and with time-ordered keys each flush adds to the end of the
// chunk key space instead of overlapping all of it, so compactions leave
// older bodies where they are rather than rewriting them again and again.
func newBlobID() store.ID {
	id := store.NewID()
	binary.BigEndian.PutUint64(id[:8], uint64(time.Now().UnixNano()))
	return id
}

// PutBlob stores a body that fits one chunk in the log, with one
// transaction; a larger body goes in chunks, a few per transaction. Either
// way the blob is durable and readable when PutBlob returns.
func (e *Engine) PutBlob(ctx context.Context, r io.Reader, maxSize int64) (store.ID, int64, error) {
	id := newBlobID()
	bufp := chunkBufs.Get().(*[]byte)
	defer chunkBufs.Put(bufp)
	buf := *bufp
	var size int64
	var chunks uint32
	var queued []*request
	// wait waits for the queued transactions, keeping at most keep of them
	// in flight, and returns the first error.
	wait := func(keep int) error {
		var first error
		for len(queued) > keep {
			if err := queued[0].wait(); err != nil && first == nil {
				first = err
			}
			queued = queued[1:]
		}
		return first
	}
	fail := func(err error) (store.ID, int64, error) {
		_ = wait(0)
		if chunks > 0 {
			if derr := e.deleteBlob(id); derr != nil {
				e.log.Warn("dropping partial blob", "blob", id, "err", derr)
			}
		}
		return id, size, err
	}
	created := binary.AppendVarint(nil, time.Now().UnixNano())
	var group [][]byte
	for {
		n, eof, err := store.FillChunk(r, buf)
		size += int64(n)
		if maxSize > 0 && size > maxSize {
			return fail(fmt.Errorf("%w: over %d bytes", ErrTooLarge, maxSize))
		}
		if err != nil {
			return fail(fmt.Errorf("reading body: %w", err))
		}
		if eof && chunks == 0 && len(group) == 0 {
			return id, size, e.update(ctx, func(t *txn) error {
				t.insert(pendingKey(id), created)
				t.putLogBlob(id, buf[:n], 0)
				return nil
			})
		}
		if ctx.Err() != nil {
			return fail(ctx.Err())
		}
		if n > 0 {
			group = append(group, append([]byte(nil), buf[:n]...))
		}
		if !eof && len(group) < 4 {
			continue
		}
		first, cs := chunks, group
		chunks += uint32(len(cs))
		group = nil
		// The pending mark goes into the first transaction, so that a
		// crash mid-body always leaves something for reclaimPending.
		rec := encodeBlob(blobRecord{Size: size, Chunks: chunks})
		req, err := e.submit(ctx, func(t *txn) error {
			if first == 0 {
				t.set(pendingKey(id), created)
			}
			for i, c := range cs {
				t.stored = true
				t.set(chunkKey(id, first+uint32(i)), c)
			}
			if eof {
				t.set(blobKey(id), rec)
			}
			return nil
		})
		if err != nil {
			return fail(err)
		}
		queued = append(queued, req)
		// Keep at most a few megabytes of a large body in memory.
		if err := wait(2); err != nil {
			return fail(err)
		}
		if eof {
			if err := wait(0); err != nil {
				return fail(err)
			}
			return id, size, nil
		}
	}
}

// deleteBlob removes a blob that no message references. It is rare (a
// failed PutBlob), so one range tombstone is fine here; see dropBlob.
func (e *Engine) deleteBlob(id store.ID) error {
	return e.update(context.Background(), func(t *txn) error {
		t.deletePrefix(chunkPrefix(id))
		t.del(blobKey(id))
		t.del(pendingKey(id))
		return nil
	})
}

// reclaimPending deletes blobs still unreferenced after olderThan. It runs
// through the committer so that it cannot race an Append taking a first
// reference.
func (e *Engine) reclaimPending(olderThan time.Duration) error {
	cutoff := time.Now().Add(-olderThan).UnixNano()
	reclaim := func(t *txn) error {
		return t.scan([]byte{tPending}, func(k, v []byte) error {
			created, n := binary.Varint(v)
			if n > 0 && created > cutoff {
				return nil
			}
			var id store.ID
			copy(id[:], k[1:])
			t.del(k)
			rv, err := t.get(blobKey(id))
			if err == nil {
				if r, err := decodeBlob(rv); err == nil && r.Seg != 0 {
					t.dropBlob(id, r)
					return nil
				}
			}
			// In chunks, and perhaps without its record yet.
			t.del(blobKey(id))
			t.deletePrefix(chunkPrefix(id))
			return nil
		})
	}
	if olderThan == 0 {
		// At open, before the committer runs: nothing is in flight.
		return e.runNow(reclaim)
	}
	return e.update(context.Background(), reclaim)
}

func (e *Engine) OpenBlob(ctx context.Context, id store.ID) (store.BlobReader, error) {
	// A body in the log may move (the cleaner copies it forward) between
	// reading its record and taking its segment: read the record again.
	for range 3 {
		rec, err := e.committedBlob(id)
		if err != nil {
			return nil, fmt.Errorf("blob %s: %w", id, err)
		}
		if rec.Seg == 0 {
			return &blobReader{e: e, id: id, rec: rec}, nil
		}
		if s, ok := e.blog.Acquire(rec.Seg); ok {
			return &blobReader{e: e, id: id, rec: rec, seg: s}, nil
		}
	}
	return nil, fmt.Errorf("blob %s: its log segment keeps moving: %w", id, errCorrupt)
}

// blobReader reads a blob from its log segment or chunk by chunk, holding at
// most one chunk.
type blobReader struct {
	e     *Engine
	id    store.ID
	rec   blobRecord
	seg   *bodylog.Segment // the log segment holding the body, or nil for chunks
	off   int64
	chunk []byte // the chunk with index cur, or nil
	cur   uint32
}

func (r *blobReader) Size() int64 { return r.rec.Size }

func (r *blobReader) load(n uint32) error {
	if r.chunk != nil && r.cur == n {
		return nil
	}
	v, err := r.e.read(chunkKey(r.id, n))
	if err != nil {
		return fmt.Errorf("blob %s chunk %d: %w", r.id, n, err)
	}
	r.chunk = append(r.chunk[:0], v...)
	r.cur = n
	return nil
}

func (r *blobReader) ReadAt(p []byte, off int64) (int, error) {
	if off < 0 {
		return 0, fmt.Errorf("%w: negative offset", store.ErrInvalid)
	}
	if r.seg != nil {
		return r.readLog(p, off)
	}
	total := 0
	for len(p) > 0 {
		if off >= r.rec.Size {
			return total, io.EOF
		}
		n := uint32(off / chunkSize)
		if err := r.load(n); err != nil {
			return total, err
		}
		within := off - int64(n)*chunkSize
		if within >= int64(len(r.chunk)) {
			return total, fmt.Errorf("blob %s: chunk %d short: %w", r.id, n, errCorrupt)
		}
		c := copy(p, r.chunk[within:])
		p, off, total = p[c:], off+int64(c), total+c
	}
	return total, nil
}

func (r *blobReader) readLog(p []byte, off int64) (int, error) {
	if off >= r.rec.Size {
		return 0, io.EOF
	}
	want := min(int64(len(p)), r.rec.Size-off)
	n, err := r.seg.ReadAt(p[:want], r.rec.Off+off)
	if int64(n) < want {
		return n, fmt.Errorf("blob %s: short in log segment %s: %v: %w", r.id, bodylog.SegName(r.seg.ID()), err, errCorrupt)
	}
	if want < int64(len(p)) {
		return n, io.EOF
	}
	return n, nil
}

func (r *blobReader) Read(p []byte) (int, error) {
	n, err := r.ReadAt(p, r.off)
	r.off += int64(n)
	if err == io.EOF && n > 0 {
		err = nil
	}
	return n, err
}

func (r *blobReader) Seek(offset int64, whence int) (int64, error) {
	switch whence {
	case io.SeekStart:
	case io.SeekCurrent:
		offset += r.off
	case io.SeekEnd:
		offset += r.rec.Size
	default:
		return 0, fmt.Errorf("%w: whence %d", store.ErrInvalid, whence)
	}
	if offset < 0 {
		return 0, fmt.Errorf("%w: negative position", store.ErrInvalid)
	}
	r.off = offset
	return offset, nil
}

func (r *blobReader) Close() error {
	r.chunk = nil
	if r.seg != nil {
		r.e.blog.Release(r.seg)
		r.seg = nil
	}
	return nil
}
