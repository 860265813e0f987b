package embedded

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"sync"
	"time"

	"github.com/cockroachdb/pebble/v2"

	"quill/internal/store"
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

func (e *Engine) PutBlob(ctx context.Context, r io.Reader, maxSize int64) (store.ID, int64, error) {
	id := newBlobID()
	bufp := chunkBufs.Get().(*[]byte)
	defer chunkBufs.Put(bufp)
	buf := *bufp
	var size int64
	var chunks uint32
	b := e.db.NewBatch()
	defer func() { b.Close() }()
	// The pending mark goes into the first batch committed, so that a crash
	// mid-body always leaves something for reclaimPending to find. A small
	// body is one batch: one WAL write in all.
	if err := b.Set(pendingKey(id), binary.AppendVarint(nil, time.Now().UnixNano()), nil); err != nil {
		return id, 0, err
	}
	fail := func(err error) (store.ID, int64, error) {
		if derr := e.deleteBlob(id); derr != nil {
			e.log.Warn("dropping partial blob", "blob", id, "err", derr)
		}
		return id, size, err
	}
	for {
		n, eof, err := store.FillChunk(r, buf)
		if n > 0 {
			size += int64(n)
			if maxSize > 0 && size > maxSize {
				return fail(fmt.Errorf("%w: over %d bytes", ErrTooLarge, maxSize))
			}
			if err := b.Set(chunkKey(id, chunks), buf[:n], nil); err != nil {
				return fail(err)
			}
			chunks++
		}
		if err != nil {
			return fail(fmt.Errorf("reading body: %w", err))
		}
		if eof {
			break
		}
		if ctx.Err() != nil {
			return fail(ctx.Err())
		}
		// Keep at most a few chunks in memory for a large body.
		if b.Len() >= 4*chunkSize {
			if err := b.Commit(pebble.NoSync); err != nil {
				return fail(err)
			}
			b.Close()
			b = e.db.NewBatch()
		}
	}
	if err := b.Set(blobKey(id), encodeBlob(blobRecord{Size: size, Chunks: chunks}), nil); err != nil {
		return fail(err)
	}
	if err := b.Commit(pebble.NoSync); err != nil {
		return fail(err)
	}
	return id, size, nil
}

// deleteBlob removes a blob that no message references. It is rare (a
// failed PutBlob), so one range tombstone is fine here; see addBlobRef.
func (e *Engine) deleteBlob(id store.ID) error {
	b := e.db.NewBatch()
	defer b.Close()
	_ = b.DeleteRange(chunkPrefix(id), prefixEnd(chunkPrefix(id)), nil)
	_ = b.Delete(blobKey(id), nil)
	_ = b.Delete(pendingKey(id), nil)
	return b.Commit(pebble.NoSync)
}

// reclaimPending deletes blobs still unreferenced after olderThan. It runs
// through the committer so that it cannot race an Append taking a first
// reference.
func (e *Engine) reclaimPending(olderThan time.Duration) error {
	cutoff := time.Now().Add(-olderThan).UnixNano()
	reclaim := func(t *txn) error {
		return t.scan([]byte{tPending}, func(k, v []byte) error {
			created, n := binary.Varint(v)
			if n <= 0 || created <= cutoff {
				var id store.ID
				copy(id[:], k[1:])
				t.del(k)
				t.del(blobKey(id))
				t.deletePrefix(chunkPrefix(id))
			}
			return nil
		})
	}
	if olderThan == 0 {
		// At open, before the committer runs: nothing is in flight.
		b := e.db.NewIndexedBatch()
		defer b.Close()
		t := &txn{e: e, b: b, touched: map[store.ID]store.Mailbox{}}
		t.begin()
		if err := reclaim(t); err != nil {
			return err
		}
		if len(t.ops) == 0 {
			return nil
		}
		t.apply()
		return b.Commit(pebble.Sync)
	}
	return e.update(context.Background(), reclaim)
}

func (e *Engine) OpenBlob(ctx context.Context, id store.ID) (store.BlobReader, error) {
	v, err := e.get(e.db, blobKey(id))
	if err != nil {
		return nil, fmt.Errorf("blob %s: %w", id, err)
	}
	rec, err := decodeBlob(v)
	if err != nil {
		return nil, err
	}
	return &blobReader{e: e, id: id, rec: rec}, nil
}

// blobReader reads a blob chunk by chunk, holding at most one chunk.
type blobReader struct {
	e     *Engine
	id    store.ID
	rec   blobRecord
	off   int64
	chunk []byte // the chunk with index cur, or nil
	cur   uint32
}

func (r *blobReader) Size() int64 { return r.rec.Size }

func (r *blobReader) load(n uint32) error {
	if r.chunk != nil && r.cur == n {
		return nil
	}
	v, closer, err := r.e.db.Get(chunkKey(r.id, n))
	if errors.Is(err, pebble.ErrNotFound) {
		return fmt.Errorf("blob %s chunk %d: %w", r.id, n, store.ErrNotFound)
	}
	if err != nil {
		return err
	}
	r.chunk = append(r.chunk[:0], v...)
	r.cur = n
	return closer.Close()
}

func (r *blobReader) ReadAt(p []byte, off int64) (int, error) {
	if off < 0 {
		return 0, fmt.Errorf("%w: negative offset", store.ErrInvalid)
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
	return nil
}
