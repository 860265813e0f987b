package cassandra

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"quill/internal/cluster/pending"
	"quill/internal/store"
	"quill/internal/store/storetest"
	"quill/internal/usermgr"
)

// putBody stores body as a blob, as a receiving node does before it
// records a pending delivery.
func putBody(t *testing.T, b *Batches, body string) store.ID {
	t.Helper()
	id, _, err := b.PutBlob(context.Background(), bytes.NewReader([]byte(body)), 0)
	if err != nil {
		t.Fatal(err)
	}
	return id
}

// mustBody reads blob id whole.
func mustBody(t *testing.T, b *Batches, id store.ID) string {
	t.Helper()
	body, err := readBody(context.Background(), b, id)
	if err != nil {
		t.Fatalf("blob %s: %v", id, err)
	}
	return body
}

func record(bucket uint32, at int64, user string, inbox, blob store.ID, body string) store.PendingDelivery {
	return store.PendingDelivery{Bucket: bucket, At: at, ID: store.NewID(), User: user, Mailbox: inbox, Blob: blob,
		Size: int64(len(body)), Flags: []string{"$Pending"}, InternalDate: time.Unix(1700000000, 0).UTC(), Meta: []byte("meta " + body)}
}

// TestPendingDeliveries: records list per bucket in their order with
// every field, carry the applier's mark, and hold their blob: the blob
// outlives the expunge of a message that shared it while a record holds
// it, and Check counts the hold. A bucket found empty leaves the list of
// buckets; a record put later brings it back.
func TestPendingDeliveries(t *testing.T) {
	ctx := context.Background()
	b := openBatches(t, newKeyspace(t))
	defer b.Close()
	const user = "p@example.test"
	inbox := storetest.UserInbox(t, b, user)
	blob := putBody(t, b, "held body")
	p2 := record(7, 200, user, inbox.ID, blob, "held body")
	p1 := record(7, 100, user, inbox.ID, blob, "held body")
	p9 := record(9, 50, user, inbox.ID, putBody(t, b, "other"), "other")
	for _, p := range []store.PendingDelivery{p2, p1, p9} {
		if err := b.PutPending(ctx, p); err != nil {
			t.Fatal(err)
		}
	}
	buckets, err := b.PendingBuckets(ctx)
	if err != nil || !slices.Equal(buckets, []uint32{7, 9}) {
		t.Fatalf("PendingBuckets = %v, %v; want [7 9]", buckets, err)
	}
	if err := b.MarkPending(ctx, p1, 42); err != nil {
		t.Fatal(err)
	}
	got, err := b.ListPending(ctx, 7, 10)
	if err != nil {
		t.Fatal(err)
	}
	want1 := p1
	want1.UID = 42
	if len(got) != 2 || fmt.Sprint(got[0]) != fmt.Sprint(want1) || fmt.Sprint(got[1]) != fmt.Sprint(p2) {
		t.Fatalf("ListPending(7) =\n%+v\nwant\n%+v", got, []store.PendingDelivery{want1, p2})
	}

	// A message shares the held blob and is expunged: the collector's
	// release finds the hold and keeps the blob.
	m := usermgr.New(b, usermgr.Options{})
	out, err := m.Append(ctx, inbox.ID, []store.NewMessage{{Blob: blob, Size: 9}}, store.AppendOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := m.Expunge(ctx, inbox.ID, []uint32{out[0].UID}); err != nil {
		t.Fatal(err)
	}
	if problems, err := b.Check(ctx); err != nil || len(problems) > 0 {
		t.Fatalf("Check = %v, %v", problems, err)
	}
	if body := mustBody(t, b, blob); body != "held body" {
		t.Fatalf("held blob reads %q", body)
	}

	for _, p := range []store.PendingDelivery{p1, p2} {
		if err := b.DeletePending(ctx, p); err != nil {
			t.Fatal(err)
		}
	}
	// A listing that finds the bucket empty forgets it, but not a row
	// put less than a second (other nodes' clocks) before it began: the
	// appliers' next polls do.
	deadline := time.Now().Add(10 * time.Second)
	for {
		if got, err := b.ListPending(ctx, 7, 10); err != nil || len(got) != 0 {
			t.Fatalf("ListPending(7) after deleting = %v, %v", got, err)
		}
		buckets, err := b.PendingBuckets(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if slices.Equal(buckets, []uint32{9}) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("PendingBuckets after bucket 7 emptied = %v; want [9]", buckets)
		}
		time.Sleep(100 * time.Millisecond) // an applier's poll interval, shortened
	}
	p3 := record(7, 300, user, inbox.ID, putBody(t, b, "later"), "later")
	if err := b.PutPending(ctx, p3); err != nil {
		t.Fatal(err)
	}
	if buckets, err := b.PendingBuckets(ctx); err != nil || !slices.Equal(buckets, []uint32{7, 9}) {
		t.Fatalf("PendingBuckets after a new record = %v, %v; want [7 9]", buckets, err)
	}
}

// testOwner manages every bucket at epoch 1 while on, as a cluster of
// one does (the applier's owner in a real node is ownership.Owner).
type testOwner struct{ off atomic.Bool }

func (o *testOwner) Manages(uint32) uint64 {
	if o.off.Load() {
		return 0
	}
	return 1
}

func (o *testOwner) Begin(string) (uint64, func() error, error) {
	if o.off.Load() {
		return 0, nil, errors.New("not managed")
	}
	return 1, func() error { return nil }, nil
}

func (o *testOwner) Epoch(string) (uint64, error) {
	if o.off.Load() {
		return 0, errors.New("not managed")
	}
	return 1, nil
}

// TestPendingApplierExactlyOnce: the applier applies a bucket's records
// in their order, each once, through the user manager: a record whose
// append landed before its applier died (not deleted) is not applied
// again; one marked by an applier that died before its append is; one
// whose mailbox is gone is dropped. The messages keep the records' flags,
// dates and summaries, and Check finds every blob accounted for.
func TestPendingApplierExactlyOnce(t *testing.T) {
	ctx := context.Background()
	b := openBatches(t, newKeyspace(t))
	defer b.Close()
	owner := &testOwner{}
	m := usermgr.New(b, usermgr.Options{Owner: owner})
	const user, gone = "x@example.test", "gone@example.test"
	for _, u := range []string{user, gone} {
		if err := b.CreateUser(ctx, store.User{Address: u}); err != nil {
			t.Fatal(err)
		}
	}
	inbox, err := b.GetMailbox(ctx, user, "INBOX")
	if err != nil {
		t.Fatal(err)
	}
	goneInbox, err := b.GetMailbox(ctx, gone, "INBOX")
	if err != nil {
		t.Fatal(err)
	}
	bodies := []string{"first", "second", "third"}
	var recs []store.PendingDelivery
	for i, body := range bodies {
		recs = append(recs, record(3, int64(100+i), user, inbox.ID, putBody(t, b, body), body))
	}
	recs = append(recs, record(3, 50, gone, goneInbox.ID, putBody(t, b, "lost"), "lost"))
	for _, p := range recs {
		if err := b.PutPending(ctx, p); err != nil {
			t.Fatal(err)
		}
	}
	if err := b.DeleteUser(ctx, gone); err != nil {
		t.Fatal(err)
	}
	// An applier that died after the append of the first record (UID 1)
	// and one that died after marking the second (UID 2) without its
	// append.
	if already, err := m.ApplyPending(ctx, b, recs[0]); err != nil || already {
		t.Fatalf("ApplyPending = %v, %v", already, err)
	}
	if err := b.MarkPending(ctx, recs[1], 2); err != nil {
		t.Fatal(err)
	}

	a, err := pending.Start(pending.Options{Store: b, Manager: m, Owner: owner, Interval: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	deadline := time.Now().Add(30 * time.Second)
	for {
		buckets, err := b.PendingBuckets(ctx)
		if err == nil && len(buckets) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("records still pending after 30s: buckets %v, %v", buckets, err)
		}
		time.Sleep(20 * time.Millisecond) // paces the polling of an observable condition
	}
	msgs, err := m.ListMessages(ctx, inbox.ID, 1, 100)
	if err != nil {
		t.Fatal(err)
	}
	if len(msgs) != len(bodies) {
		t.Fatalf("INBOX holds %d messages, want %d: %+v", len(msgs), len(bodies), msgs)
	}
	for i, msg := range msgs {
		if msg.UID != uint32(i+1) || msg.Blob != recs[i].Blob || mustBody(t, b, msg.Blob) != bodies[i] {
			t.Errorf("message %d: UID %d blob %s, want UID %d with %q", i, msg.UID, msg.Blob, i+1, bodies[i])
		}
		if !slices.Equal(msg.Flags, []string{"$Pending"}) || !msg.InternalDate.Equal(recs[i].InternalDate) || string(msg.Meta) != "meta "+bodies[i] {
			t.Errorf("message %d: flags %v, date %v, meta %q", i, msg.Flags, msg.InternalDate, msg.Meta)
		}
	}
	if problems, err := b.Check(ctx); err != nil || len(problems) > 0 {
		t.Fatalf("Check = %v, %v", problems, err)
	}
}
