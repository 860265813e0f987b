package cassandra

import (
	"context"
	"encoding/binary"
	"time"

	"quill/internal/store"
)

var _ store.PendingDeliveries = (*Engine)(nil)

// Pending deliveries (store.PendingDeliveries, ADR 0034), shared by both
// modes. A record is written in three steps, each at the write
// consistency: the hold on its blob (a blob_refs row of the record's
// mailbox with a negative UID of the record's own, which no release
// passes: blobs.go, batchgc.go), the record, and its bucket's row in
// pending_buckets. Deleting goes the other way round but for the bucket
// row, which ListPending drops when it finds the bucket empty: with a
// timestamp from before its read began (less a second for the clocks of
// other nodes), so that the row of a record put after that read, whose
// write the read may have missed, outlives the deletion.

// holdUID is the blob_refs UID of p's hold on its blob: negative, and
// distinct per record.
func holdUID(id store.ID) int64 {
	return -1 - int64(binary.BigEndian.Uint64(id[:8])>>2)
}

// PutPending implements store.PendingDeliveries.
func (e *Engine) PutPending(ctx context.Context, p store.PendingDelivery) error {
	if err := e.write(ctx, `INSERT INTO blob_refs (id, mailbox, uid) VALUES (?, ?, ?)`,
		p.Blob[:], p.Mailbox[:], holdUID(p.ID)).Exec(); err != nil {
		return wrap("holding a pending delivery's blob", err)
	}
	if err := e.write(ctx, `INSERT INTO pending_deliveries (bucket, at, id, address, mailbox, blob, size, flags, internal_date, meta, uid)
		VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`,
		int(p.Bucket), p.At, p.ID[:], p.User, p.Mailbox[:], p.Blob[:], p.Size, joinFlags(p.Flags), p.InternalDate, p.Meta, int64(p.UID)).Exec(); err != nil {
		return wrap("recording a pending delivery", err)
	}
	return wrap("listing a pending delivery's bucket", e.write(ctx,
		`INSERT INTO pending_buckets (k, bucket) VALUES (0, ?)`, int(p.Bucket)).Exec())
}

// PendingBuckets implements store.PendingDeliveries.
func (e *Engine) PendingBuckets(ctx context.Context) ([]uint32, error) {
	it := e.read(ctx, `SELECT bucket FROM pending_buckets WHERE k = 0`).PageSize(1000).Iter()
	var out []uint32
	var b int
	for it.Scan(&b) {
		out = append(out, uint32(b))
	}
	return out, wrap("listing buckets with pending deliveries", it.Close())
}

// ListPending implements store.PendingDeliveries. A row without an
// address is what a late MarkPending leaves of a deleted record: it is
// deleted, not returned.
func (e *Engine) ListPending(ctx context.Context, bucket uint32, limit int) ([]store.PendingDelivery, error) {
	began := time.Now()
	it := e.read(ctx, `SELECT at, id, address, mailbox, blob, size, flags, internal_date, meta, uid
		FROM pending_deliveries WHERE bucket = ? LIMIT ?`, int(bucket), limit).Iter()
	var out, husks []store.PendingDelivery
	var (
		id, mailbox, blob, meta []byte
		address, flags          *string
		size, uid               *int64
		date                    time.Time
		at                      int64
	)
	for it.Scan(&at, &id, &address, &mailbox, &blob, &size, &flags, &date, &meta, &uid) {
		p := store.PendingDelivery{Bucket: bucket, At: at, ID: store.ID(id), User: deref(address)}
		if p.User == "" || len(mailbox) != len(p.Mailbox) || len(blob) != len(p.Blob) {
			husks = append(husks, p)
			continue
		}
		p.Mailbox, p.Blob = store.ID(mailbox), store.ID(blob)
		p.Size, p.Flags, p.InternalDate = deref(size), splitFlags(deref(flags)), date.UTC()
		p.Meta = append([]byte(nil), meta...)
		p.UID = uint32(deref(uid))
		out = append(out, p)
	}
	if err := it.Close(); err != nil {
		return nil, wrap("listing pending deliveries", err)
	}
	for _, h := range husks {
		if err := e.deleteRecord(ctx, h); err != nil {
			return nil, err
		}
	}
	if len(out) == 0 && len(husks) == 0 {
		ts := began.Add(-time.Second).UnixMicro()
		if err := e.write(ctx, `DELETE FROM pending_buckets USING TIMESTAMP ? WHERE k = 0 AND bucket = ?`, ts, int(bucket)).Exec(); err != nil {
			return nil, wrap("forgetting an empty bucket of pending deliveries", err)
		}
	}
	return out, nil
}

// MarkPending implements store.PendingDeliveries.
func (e *Engine) MarkPending(ctx context.Context, p store.PendingDelivery, uid uint32) error {
	return wrap("marking a pending delivery", e.write(ctx, `UPDATE pending_deliveries SET uid = ? WHERE bucket = ? AND at = ? AND id = ?`,
		int64(uid), int(p.Bucket), p.At, p.ID[:]).Exec())
}

// DeletePending implements store.PendingDeliveries: the record, then the
// hold (a crash between leaves the blob held: a leak Check reports, never
// a message without its body).
func (e *Engine) DeletePending(ctx context.Context, p store.PendingDelivery) error {
	if err := e.deleteRecord(ctx, p); err != nil {
		return err
	}
	return wrap("releasing a pending delivery's blob", e.write(ctx, `DELETE FROM blob_refs WHERE id = ? AND mailbox = ? AND uid = ?`,
		p.Blob[:], p.Mailbox[:], holdUID(p.ID)).Exec())
}

func (e *Engine) deleteRecord(ctx context.Context, p store.PendingDelivery) error {
	return wrap("deleting a pending delivery", e.write(ctx, `DELETE FROM pending_deliveries WHERE bucket = ? AND at = ? AND id = ?`,
		int(p.Bucket), p.At, p.ID[:]).Exec())
}

// The batch mode shares them.

func (b *Batches) PutPending(ctx context.Context, p store.PendingDelivery) error {
	return b.e.PutPending(ctx, p)
}
func (b *Batches) PendingBuckets(ctx context.Context) ([]uint32, error) {
	return b.e.PendingBuckets(ctx)
}
func (b *Batches) ListPending(ctx context.Context, bucket uint32, limit int) ([]store.PendingDelivery, error) {
	return b.e.ListPending(ctx, bucket, limit)
}
func (b *Batches) MarkPending(ctx context.Context, p store.PendingDelivery, uid uint32) error {
	return b.e.MarkPending(ctx, p, uid)
}
func (b *Batches) DeletePending(ctx context.Context, p store.PendingDelivery) error {
	return b.e.DeletePending(ctx, p)
}

// pendingHolds returns the blob_refs rows that pending deliveries hold:
// the checks count them as references and report nothing of them.
func (e *Engine) pendingHolds(ctx context.Context) (map[blobRef]bool, error) {
	holds := map[blobRef]bool{}
	it := e.read(ctx, `SELECT id, mailbox, blob FROM pending_deliveries`).PageSize(1000).Iter()
	var id, mailbox, blob []byte
	for it.Scan(&id, &mailbox, &blob) {
		if len(id) != len(store.ID{}) || len(mailbox) != len(store.ID{}) || len(blob) != len(store.ID{}) {
			continue // a husk (ListPending deletes it)
		}
		holds[blobRef{store.ID(blob), store.ID(mailbox), holdUID(store.ID(id))}] = true
	}
	return holds, wrap("scanning pending deliveries", it.Close())
}

// blobRef is a blob_refs row.
type blobRef struct {
	blob, mailbox store.ID
	uid           int64
}
