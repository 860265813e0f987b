package store

import (
	"context"
	"time"
)

// PendingDelivery is a message a node accepted for a user whose manager
// it could not reach in time (the cluster issue's item 6, ADR 0034): the
// body is stored (Blob), the record is durable, and the client had its
// 250. The bucket's manager, current or next, applies it: it appends the
// message to Mailbox as the delivery would have, and then deletes the
// record.
type PendingDelivery struct {
	// Bucket is the user's bucket (usermap.Bucket): the records of one
	// bucket are listed together, by the node that manages it.
	Bucket uint32
	// At (Unix nanoseconds, the accepting node's clock) and ID order the
	// records of a bucket: they are applied in that order.
	At int64
	ID ID
	// User owns Mailbox, the INBOX the message is for.
	User    string
	Mailbox ID
	// The message, as the delivery's Append would have added it; Blob is
	// held (never released) while the record exists.
	Blob         ID
	Size         int64
	Flags        []string
	InternalDate time.Time
	Meta         []byte
	// UID is 0, or the UID the last applier gave the message just before
	// it submitted the append (MarkPending): the next applier finds the
	// message there if that append was applied.
	UID uint32
}

// PendingDeliveries is implemented by an engine that several nodes share,
// whose deliveries may find the user's manager unreachable. Its writes
// are durable at the engine's write consistency when they return.
type PendingDeliveries interface {
	// PutPending records p and holds p.Blob until DeletePending: a blob
	// no message references is otherwise released.
	PutPending(ctx context.Context, p PendingDelivery) error
	// PendingBuckets lists the buckets that may hold records (a superset
	// of those that do).
	PendingBuckets(ctx context.Context) ([]uint32, error)
	// ListPending returns up to limit records of bucket, in (At, ID)
	// order. When it finds none, it forgets the bucket in PendingBuckets
	// unless a record is put meanwhile.
	ListPending(ctx context.Context, bucket uint32, limit int) ([]PendingDelivery, error)
	// MarkPending records the UID an applier is about to give p's
	// message.
	MarkPending(ctx context.Context, p PendingDelivery, uid uint32) error
	// DeletePending deletes p and its hold on p.Blob.
	DeletePending(ctx context.Context, p PendingDelivery) error
}
