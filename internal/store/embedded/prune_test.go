package embedded

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2"

	"quill/internal/store"
)

// expungeEntries counts the expunge entries in a mailbox's change log.
func expungeEntries(t *testing.T, e *Engine, mbox store.ID) int {
	t.Helper()
	p := changePrefix(mbox)
	it, err := e.db.NewIter(&pebble.IterOptions{LowerBound: p, UpperBound: prefixEnd(p)})
	if err != nil {
		t.Fatal(err)
	}
	defer it.Close()
	n := 0
	for it.First(); it.Valid(); it.Next() {
		if store.ChangeKind(it.Value()[0]) == store.ChangeExpunged {
			n++
		}
	}
	return n
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

// TestExpungesPruned runs POP3's pattern (deliver, then expunge) through
// a mailbox that also keeps one flagged message: the expunge entries stay
// bounded by the window, every expunge above the floor is still reported,
// a resync from below the floor is refused rather than answered in part,
// and the floor survives a reopen.
func TestExpungesPruned(t *testing.T) {
	const window = 8
	dir := t.TempDir()
	ctx := context.Background()
	e, err := Open(dir, Options{ExpungeWindow: window})
	if err != nil {
		t.Fatal(err)
	}
	inbox := userInbox(t, e, "p@example.test")
	kept := appendOne(t, e, inbox.ID, "kept\r\n")
	if _, err := e.SetFlags(ctx, inbox.ID, store.FlagChange{UIDs: []uint32{kept.UID}, Op: store.FlagsAdd, Flags: []string{store.FlagSeen}}); err != nil {
		t.Fatal(err)
	}
	expungedAt := map[uint32]uint64{}
	for i := range 100 {
		m := appendOne(t, e, inbox.ID, "churn\r\n")
		gone, modseq, err := e.Expunge(ctx, inbox.ID, []uint32{m.UID})
		if err != nil || len(gone) != 1 {
			t.Fatalf("round %d: expunge = %v, %v", i, gone, err)
		}
		expungedAt[m.UID] = modseq
		if n := expungeEntries(t, e, inbox.ID); n > 2*window {
			t.Fatalf("round %d: %d expunge entries kept, want at most %d", i, n, 2*window)
		}
	}
	mb, err := e.GetMailboxByID(ctx, inbox.ID)
	if err != nil {
		t.Fatal(err)
	}
	if mb.ExpungeFloor == 0 || mb.ExpungeFloor+2*window <= mb.HighestModSeq {
		t.Fatalf("floor %d with highest modseq %d, window %d", mb.ExpungeFloor, mb.HighestModSeq, window)
	}
	if _, err := e.Changes(ctx, inbox.ID, mb.ExpungeFloor-1, 1000); !errors.Is(err, store.ErrExpungesForgotten) {
		t.Fatalf("changes since %d below the floor %d: %v, want ErrExpungesForgotten", mb.ExpungeFloor-1, mb.ExpungeFloor, err)
	}
	changes, err := e.Changes(ctx, inbox.ID, mb.ExpungeFloor, 1000)
	if err != nil {
		t.Fatal(err)
	}
	reported := map[uint32]uint64{}
	for _, c := range changes {
		if c.Kind == store.ChangeExpunged {
			reported[c.UID] = c.ModSeq
		}
	}
	for uid, ms := range expungedAt {
		if got, ok := reported[uid]; ms > mb.ExpungeFloor && (!ok || got != ms) {
			t.Errorf("uid %d expunged at %d above the floor %d: reported %v at %d", uid, ms, mb.ExpungeFloor, ok, got)
		}
	}
	// The message that stayed keeps its entry below the floor.
	if msg, err := e.GetMessage(ctx, inbox.ID, kept.UID); err != nil || msg.ModSeq > mb.ExpungeFloor {
		t.Fatalf("kept message: %+v, %v", msg, err)
	}
	checkClean(t, e)
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	e = open(t, dir)
	defer e.Close()
	again, err := e.GetMailboxByID(ctx, inbox.ID)
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
	if n := expungeEntries(t, e, inbox.ID); n != 1 {
		t.Fatalf("%d expunge entries left, want the last one only", n)
	}
	changes, err := e.Changes(ctx, inbox.ID, bulkAt, 10)
	if err != nil || len(changes) != 1 || changes[0].UID != one.UID || changes[0].Kind != store.ChangeExpunged {
		t.Fatalf("changes since the floor: %+v, %v", changes, err)
	}
	checkClean(t, e)
}
