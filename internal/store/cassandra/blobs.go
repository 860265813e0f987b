package cassandra

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"quill/internal/store"
)

func blobShard(id store.ID) int { return int(id[0]) % indexShards }

// PutBlob writes the pending mark, then the chunks (each its own partition),
// then the blob row that makes the blob visible. A crash leaves a pending
// mark for the reclaimer; a failed or oversized read removes what it wrote.
func (e *Engine) PutBlob(ctx context.Context, r io.Reader, maxSize int64) (store.ID, int64, error) {
	id := store.NewID()
	if err := e.write(ctx, `INSERT INTO pending_blobs (shard, id, created) VALUES (?, ?, ?)`,
		blobShard(id), id[:], time.Now()).Exec(); err != nil {
		return store.ID{}, 0, wrap("marking blob", err)
	}
	var size int64
	chunks := 0
	buf := make([]byte, chunkSize)
	fail := func(err error) (store.ID, int64, error) {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		defer cancel()
		if derr := e.deleteBlob(cctx, id, chunks); derr != nil {
			e.log.Warn("removing a failed blob; the reclaimer will retry", "blob", id, "err", derr)
		}
		return store.ID{}, 0, err
	}
	for {
		n, err := io.ReadFull(r, buf)
		if n > 0 {
			size += int64(n)
			if maxSize > 0 && size > maxSize {
				return fail(fmt.Errorf("%w: body exceeds %d bytes", store.ErrInvalid, maxSize))
			}
			if werr := e.write(ctx, `INSERT INTO blob_chunks (id, chunk, data) VALUES (?, ?, ?)`, id[:], chunks, buf[:n]).Exec(); werr != nil {
				chunks++
				return fail(wrap("writing blob chunk", werr))
			}
			chunks++
		}
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
			break
		}
		if err != nil {
			return fail(fmt.Errorf("reading body: %w", err))
		}
	}
	if err := e.write(ctx, `INSERT INTO blobs (id, size, chunks, created) VALUES (?, ?, ?, ?)`,
		id[:], size, chunks, time.Now()).Exec(); err != nil {
		return fail(wrap("writing blob", err))
	}
	return id, size, nil
}

func (e *Engine) blobInfo(ctx context.Context, id store.ID) (size int64, chunks int, err error) {
	err = e.read(ctx, `SELECT size, chunks FROM blobs WHERE id = ?`, id[:]).Scan(&size, &chunks)
	return size, chunks, wrap("blob "+id.String(), err)
}

// deleteBlob removes the blob row first (the blob disappears at once), then
// its chunks and its pending mark.
func (e *Engine) deleteBlob(ctx context.Context, id store.ID, chunks int) error {
	if err := e.write(ctx, `DELETE FROM blobs WHERE id = ?`, id[:]).Exec(); err != nil {
		return wrap("deleting blob", err)
	}
	for c := 0; c < chunks; c++ {
		if err := e.write(ctx, `DELETE FROM blob_chunks WHERE id = ? AND chunk = ?`, id[:], c).Exec(); err != nil {
			return wrap("deleting blob chunk", err)
		}
	}
	return wrap("unmarking blob", e.write(ctx, `DELETE FROM pending_blobs WHERE shard = ? AND id = ?`, blobShard(id), id[:]).Exec())
}

// releaseBlob deletes a blob that no message references any more.
func (e *Engine) releaseBlob(ctx context.Context, id store.ID) error {
	var mbox []byte
	err := e.read(ctx, `SELECT mailbox FROM blob_refs WHERE id = ? LIMIT 1`, id[:]).Scan(&mbox)
	if err == nil {
		return nil // still referenced
	}
	if !isDriverNotFound(err) {
		return wrap("reading blob references", err)
	}
	_, chunks, err := e.blobInfo(ctx, id)
	if isNotFound(err) {
		return nil
	}
	if err != nil {
		return err
	}
	return e.deleteBlob(ctx, id, chunks)
}

// reclaimPending deletes blobs marked pending longer than olderThan that no
// message references (bodies of deliveries that never completed).
func (e *Engine) reclaimPending(ctx context.Context, olderThan time.Duration) error {
	cutoff := time.Now().Add(-olderThan)
	for shard := 0; shard < indexShards; shard++ {
		it := e.read(ctx, `SELECT id, created FROM pending_blobs WHERE shard = ?`, shard).PageSize(500).Iter()
		var raw []byte
		var created time.Time
		var old []store.ID
		for it.Scan(&raw, &created) {
			if created.Before(cutoff) {
				var id store.ID
				copy(id[:], raw)
				old = append(old, id)
			}
		}
		if err := it.Close(); err != nil {
			return wrap("listing pending blobs", err)
		}
		for _, id := range old {
			var mbox []byte
			err := e.read(ctx, `SELECT mailbox FROM blob_refs WHERE id = ? LIMIT 1`, id[:]).Scan(&mbox)
			if err == nil {
				_ = e.write(ctx, `DELETE FROM pending_blobs WHERE shard = ? AND id = ?`, blobShard(id), id[:]).Exec()
				continue
			}
			if !isDriverNotFound(err) {
				return wrap("reading blob references", err)
			}
			_, chunks, err := e.blobInfo(ctx, id)
			if isNotFound(err) {
				// Interrupted PutBlob: chunks may exist without the blob row.
				if err := e.deleteOrphanChunks(ctx, id); err != nil {
					return err
				}
				chunks = 0
			} else if err != nil {
				return err
			}
			if err := e.deleteBlob(ctx, id, chunks); err != nil {
				return err
			}
		}
	}
	return nil
}

// deleteOrphanChunks deletes the chunks of a blob whose row was never
// written, probing chunk numbers until the first missing one.
func (e *Engine) deleteOrphanChunks(ctx context.Context, id store.ID) error {
	for c := 0; ; c++ {
		var n int
		err := e.read(ctx, `SELECT chunk FROM blob_chunks WHERE id = ? AND chunk = ?`, id[:], c).Scan(&n)
		if isDriverNotFound(err) {
			return nil
		}
		if err != nil {
			return wrap("probing blob chunk", err)
		}
		if err := e.write(ctx, `DELETE FROM blob_chunks WHERE id = ? AND chunk = ?`, id[:], c).Exec(); err != nil {
			return wrap("deleting blob chunk", err)
		}
	}
}

func (e *Engine) OpenBlob(ctx context.Context, id store.ID) (store.BlobReader, error) {
	size, chunks, err := e.blobInfo(ctx, id)
	if err != nil {
		return nil, err
	}
	return &blobReader{e: e, ctx: context.WithoutCancel(ctx), id: id, size: size, chunks: chunks, cur: -1}, nil
}

// blobReader reads chunks on demand and keeps the last one.
type blobReader struct {
	e      *Engine
	ctx    context.Context
	id     store.ID
	size   int64
	chunks int
	off    int64
	cur    int
	data   []byte
}

func (r *blobReader) Size() int64 { return r.size }

func (r *blobReader) chunk(c int) ([]byte, error) {
	if c == r.cur {
		return r.data, nil
	}
	ctx, cancel := context.WithTimeout(r.ctx, r.e.opts.Timeout)
	defer cancel()
	var data []byte
	if err := r.e.read(ctx, `SELECT data FROM blob_chunks WHERE id = ? AND chunk = ?`, r.id[:], c).Scan(&data); err != nil {
		return nil, wrap(fmt.Sprintf("blob %s chunk %d", r.id, c), err)
	}
	r.cur, r.data = c, data
	return data, nil
}

func (r *blobReader) ReadAt(p []byte, off int64) (int, error) {
	if off < 0 {
		return 0, fmt.Errorf("%w: negative offset", store.ErrInvalid)
	}
	n := 0
	for n < len(p) {
		pos := off + int64(n)
		if pos >= r.size {
			return n, io.EOF
		}
		data, err := r.chunk(int(pos / chunkSize))
		if err != nil {
			return n, err
		}
		in := int(pos % chunkSize)
		if in >= len(data) {
			return n, io.ErrUnexpectedEOF
		}
		n += copy(p[n:], data[in:])
	}
	return n, nil
}

func (r *blobReader) Read(p []byte) (int, error) {
	if r.off >= r.size {
		return 0, io.EOF
	}
	if int64(len(p)) > r.size-r.off {
		p = p[:r.size-r.off]
	}
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
		offset += r.size
	default:
		return 0, fmt.Errorf("%w: whence %d", store.ErrInvalid, whence)
	}
	if offset < 0 {
		return 0, fmt.Errorf("%w: negative position", store.ErrInvalid)
	}
	r.off = offset
	return offset, nil
}

func (r *blobReader) Close() error { r.data = nil; return nil }
