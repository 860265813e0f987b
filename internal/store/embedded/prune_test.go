package embedded

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2"

	"quill/internal/store"
	"quill/internal/store/storetest"
)

// logEntries counts the entries in a mailbox's change log: all of them,
// and the expunges.
func logEntries(t *testing.T, e *Engine, mbox store.ID) (all, expunges int) {
	t.Helper()
	p := changePrefix(mbox)
	it, err := e.db.NewIter(&pebble.IterOptions{LowerBound: p, UpperBound: prefixEnd(p)})
	if err != nil {
		t.Fatal(err)
	}
	defer it.Close()
	for it.First(); it.Valid(); it.Next() {
		all++
		if store.ChangeKind(it.Value()[0]) == store.ChangeExpunged {
			expunges++
		}
	}
	return all, expunges
}

func checkClean(t *testing.T, e *Engine) {
	t.Helper()
	problems, err := e.Check(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Error(p)
	}
}

// TestExpungesPruned runs the conformance test of forgotten expunges
// (storetest.ExpungeFloor), then checks that the floor survives a reopen.
func TestExpungesPruned(t *testing.T) {
	const window = 8
	dir := t.TempDir()
	ctx := context.Background()
	e, err := Open(dir, Options{ExpungeWindow: window})
	if err != nil {
		t.Fatal(err)
	}
	mb := storetest.ExpungeFloor(t, e, window, func(mbox store.ID) int {
		all, _ := logEntries(t, e, mbox)
		return all
	})
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	e = open(t, dir)
	defer e.Close()
	again, err := e.GetMailboxByID(ctx, mb.ID)
	if err != nil || again.ExpungeFloor != mb.ExpungeFloor {
		t.Fatalf("after reopen: floor %d (%v), want %d", again.ExpungeFloor, err, mb.ExpungeFloor)
	}
	checkClean(t, e)
}

// TestPruneStopsAtModSeqBoundary: one prune reads at most about
// pruneBatch entries, but never stops inside a MODSEQ, so the floor never
// claims an expunge that is still in the log is gone, nor the reverse.
func TestPruneStopsAtModSeqBoundary(t *testing.T) {
	ctx := context.Background()
	e, err := Open(t.TempDir(), Options{ExpungeWindow: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	inbox := userInbox(t, e, "b@example.test")
	blob, n, err := e.PutBlob(ctx, strings.NewReader("bulk\r\n"), 0)
	if err != nil {
		t.Fatal(err)
	}
	const bulk = pruneBatch + 500
	nms := make([]store.NewMessage, bulk)
	for i := range nms {
		nms[i] = store.NewMessage{Blob: blob, Size: n, InternalDate: time.Now()}
	}
	msgs, err := e.Append(ctx, inbox.ID, nms, store.AppendOptions{})
	if err != nil {
		t.Fatal(err)
	}
	uids := make([]uint32, len(msgs))
	for i, m := range msgs {
		uids[i] = m.UID
	}
	_, bulkAt, err := e.Expunge(ctx, inbox.ID, uids)
	if err != nil {
		t.Fatal(err)
	}
	// The next expunge's prune reads the bulk expunge's entries, more than
	// pruneBatch at one MODSEQ, all of them, and stops there.
	one := appendOne(t, e, inbox.ID, "one\r\n")
	if _, _, err := e.Expunge(ctx, inbox.ID, []uint32{one.UID}); err != nil {
		t.Fatal(err)
	}
	mb, err := e.GetMailboxByID(ctx, inbox.ID)
	if err != nil {
		t.Fatal(err)
	}
	if mb.ExpungeFloor != bulkAt {
		t.Fatalf("floor %d, want the bulk expunge's modseq %d (highest %d)", mb.ExpungeFloor, bulkAt, mb.HighestModSeq)
	}
	if _, n := logEntries(t, e, inbox.ID); n != 1 {
		t.Fatalf("%d expunge entries left, want the last one only", n)
	}
	changes, err := e.Changes(ctx, inbox.ID, bulkAt, 10)
	if err != nil || len(changes) != 1 || changes[0].UID != one.UID || changes[0].Kind != store.ChangeExpunged {
		t.Fatalf("changes since the floor: %+v, %v", changes, err)
	}
	checkClean(t, e)
}
