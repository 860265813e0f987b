package cassandra

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"time"

	"quill/internal/store"
)

func blobShard(id store.ID) int { return int(id[0]) % indexShards }

// PutBlob writes the pending mark, then the chunks (each its own partition),
// then the blob row that makes the blob visible. A body that fits one
// chunk is kept in the blob row itself (data, as the batch mode keeps its
// inline bodies): two writes instead of three, and one read instead of
// two to read it back. A crash leaves a pending mark for the reclaimer; a
// failed or oversized read removes what it wrote.
func (e *Engine) PutBlob(ctx context.Context, r io.Reader, maxSize int64) (store.ID, int64, error) {
	id := store.NewID()
	// A body bounded below one chunk (a forwarded delivery's, whose size
	// is known) gets a buffer of that bound, one byte more to see a body
	// that exceeds it: a chunk's 256 KiB, zeroed, per 5 KB message was
	// most of a forwarding node's allocation and so of its collector's
	// work. The buffer is not pooled: the driver may still marshal a
	// speculative or retried attempt's values after Exec returned.
	bufLen := chunkSize
	if maxSize > 0 && maxSize < chunkSize {
		bufLen = int(maxSize) + 1
	}
	buf := make([]byte, bufLen)
	// The first chunk is read before anything is written: a body that
	// fails to arrive, or is too large for one chunk's check, leaves
	// nothing behind.
	n, end, err := store.FillChunk(r, buf)
	if err != nil {
		return store.ID{}, 0, fmt.Errorf("reading body: %w", err)
	}
	if maxSize > 0 && int64(n) > maxSize {
		return store.ID{}, 0, fmt.Errorf("%w: body exceeds %d bytes", store.ErrInvalid, maxSize)
	}
	if err := e.write(ctx, `INSERT INTO pending_blobs (shard, id, created) VALUES (?, ?, ?)`,
		blobShard(id), id[:], time.Now()).Exec(); err != nil {
		return store.ID{}, 0, wrap("marking blob", err)
	}
	size := int64(n)
	chunks := 0
	fail := func(err error) (store.ID, int64, error) {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		defer cancel()
		if derr := e.deleteBlob(cctx, id, chunks); derr != nil {
			e.log.Warn("removing a failed blob; the reclaimer will retry", "blob", id, "err", derr)
		}
		return store.ID{}, 0, err
	}
	if end {
		if err := e.write(ctx, `INSERT INTO blobs (id, size, chunks, data, created) VALUES (?, ?, 0, ?, ?)`,
			id[:], size, buf[:n], time.Now()).Exec(); err != nil {
			return fail(wrap("writing blob", err))
		}
		return id, size, nil
	}
	for {
		if n > 0 {
			if werr := e.write(ctx, `INSERT INTO blob_chunks (id, chunk, data) VALUES (?, ?, ?)`, id[:], chunks, buf[:n]).Exec(); werr != nil {
				chunks++
				return fail(wrap("writing blob chunk", werr))
			}
			chunks++
		}
		if end {
			break
		}
		if n, end, err = store.FillChunk(r, buf); err != nil {
			return fail(fmt.Errorf("reading body: %w", err))
		}
		size += int64(n)
		if maxSize > 0 && size > maxSize {
			return fail(fmt.Errorf("%w: body exceeds %d bytes", store.ErrInvalid, maxSize))
		}
	}
	if err := e.write(ctx, `INSERT INTO blobs (id, size, chunks, created) VALUES (?, ?, ?, ?)`,
		id[:], size, chunks, time.Now()).Exec(); err != nil {
		return fail(wrap("writing blob", err))
	}
	return id, size, nil
}

// blobInfo reads a blob's row; a blob being released is not found.
func (e *Engine) blobInfo(ctx context.Context, id store.ID) (size int64, chunks int, err error) {
	size, chunks, _, err = e.blobRow(ctx, id)
	return size, chunks, err
}

// blobRow reads a blob's row with its inline data (a body the batch mode
// wrote in the row itself, nil otherwise).
func (e *Engine) blobRow(ctx context.Context, id store.ID) (size int64, chunks int, data []byte, err error) {
	err = e.read(ctx, `SELECT size, chunks, data FROM blobs WHERE id = ?`, id[:]).Scan(&size, &chunks, &data)
	if err == nil && chunks == doomed {
		return 0, 0, nil, fmt.Errorf("blob %s: %w (being released)", id, store.ErrNotFound)
	}
	return size, chunks, data, wrap("blob "+id.String(), err)
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

// Sharing a blob safely: claims and doom.
//
// Invariant: no committed message references a deleted blob. An Append
// may reference a blob whose other references are being expunged at the
// same moment (one delivery's recipients are appended concurrently, and a
// POP3 or IMAP session on another node may expunge the first copy before
// the last append; so may a COPY racing an expunge), so the reference
// check and the release must exclude each other:
//
//	Append:  write claim (a blob_refs row with a negative UID)
//	         read the blob row: missing or doomed -> ErrNotFound
//	         commit and apply (the real blob_refs rows); delete the claim
//	release: no blob_refs row -> LWT: doom the row (chunks = -1)
//	         read blob_refs again: a claim -> LWT: undoom, keep the blob
//	         none -> delete the chunks, the mark and the row
//
// Each side writes, then reads what the other writes (both at the write
// and read consistency, R + W > RF), so at least one sees the other: an
// Append that found the row intact has its claim seen by the releaser, and
// a releaser that saw no claim doomed the row before the Append could read
// it. The doom is an LWT so that two releasers (two expunges of the last
// two copies, or a roll-forward beside its slow original) cannot both act:
// one owns the doom, the other leaves the blob to it.
//
// An Append that loses this race fails with ErrNotFound (the delivery
// answers 451 and the client retries: at most a duplicate, never a loss).
// Rejected: keeping every blob until its PutBlob mark expires (the store
// contract releases a blob when its last reference goes), and an LWT on
// every Append (a Paxos round per recipient on the delivery path; here the
// LWT is paid once per blob released, on the expunge path).

// doomed is the chunks value of a blob being released.
const doomed = -1

// blobReferenced reports whether any message or in-flight Append holds id.
func (e *Engine) blobReferenced(ctx context.Context, id store.ID) (bool, error) {
	var mbox []byte
	err := e.read(ctx, `SELECT mailbox FROM blob_refs WHERE id = ? LIMIT 1`, id[:]).Scan(&mbox)
	if err == nil {
		return true, nil
	}
	if isDriverNotFound(err) {
		return false, nil
	}
	return false, wrap("reading blob references", err)
}

// releaseBlob deletes a blob that no message references any more (see
// above).
func (e *Engine) releaseBlob(ctx context.Context, id store.ID) error {
	if ref, err := e.blobReferenced(ctx, id); err != nil || ref {
		return err
	}
	_, chunks, err := e.blobInfo(ctx, id)
	if isNotFound(err) {
		return nil
	}
	if err != nil {
		return err
	}
	applied, err := e.cas(ctx, `UPDATE blobs SET chunks = ? WHERE id = ? IF chunks = ?`, doomed, id[:], chunks).MapScanCAS(map[string]any{})
	if err != nil {
		return wrap("dooming blob", err) // its state is for the next release or the operator's Check
	}
	if !applied {
		return nil // another releaser owns it
	}
	ref, err := e.blobReferenced(ctx, id)
	if err != nil || ref {
		// Claimed meanwhile (or unknown): keep it.
		if _, uerr := e.cas(ctx, `UPDATE blobs SET chunks = ? WHERE id = ? IF chunks = ?`, chunks, id[:], doomed).MapScanCAS(map[string]any{}); uerr != nil {
			return errors.Join(err, wrap("restoring a claimed blob", uerr))
		}
		return err
	}
	return e.deleteBlob(ctx, id, chunks)
}

// claimBlobs writes an Append's claim on every blob it will reference and
// then checks that each is intact; it returns the release of the claims,
// which the caller runs once the append is applied (or failed for good).
func (e *Engine) claimBlobs(ctx context.Context, mailbox store.ID, blobs []store.ID) (func(), error) {
	claim := -1 - rand.Int64N(1<<62)
	var claimed []store.ID
	unclaim := func() {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), e.opts.Timeout)
		defer cancel()
		for _, b := range claimed {
			if err := e.write(cctx, `DELETE FROM blob_refs WHERE id = ? AND mailbox = ? AND uid = ?`, b[:], mailbox[:], claim).Exec(); err != nil {
				e.log.Warn("removing a blob claim; the blob outlives its last message", "blob", b, "err", err)
			}
		}
	}
	for _, b := range blobs {
		if err := e.write(ctx, `INSERT INTO blob_refs (id, mailbox, uid) VALUES (?, ?, ?)`, b[:], mailbox[:], claim).Exec(); err != nil {
			unclaim()
			return nil, wrap("claiming blob", err)
		}
		claimed = append(claimed, b)
	}
	for _, b := range blobs {
		if _, _, err := e.blobInfo(ctx, b); err != nil {
			unclaim()
			return nil, err
		}
	}
	return unclaim, nil
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
	size, chunks, data, err := e.blobRow(ctx, id)
	if err != nil {
		return nil, err
	}
	r := &blobReader{e: e, ctx: context.WithoutCancel(ctx), id: id, size: size, chunks: chunks, cur: -1}
	if data != nil {
		r.cur, r.data = 0, data // the whole body, in the row (one chunk)
	}
	return r, nil
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
