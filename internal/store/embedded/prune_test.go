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
	if err := e.checkpoint("test"); err != nil {
		t.Fatal(err)
	}
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
	mb := storetest.ExpungeFloor(t, writer(e), window, func(mbox store.ID) int {
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
// claims an expunge that is still in the log is gone, nor the reverse. A
// STORE to many messages is what puts more than pruneBatch entries at one
// MODSEQ (an expunge's UIDs share entries, see TestExpungeEntries).
func TestPruneStopsAtModSeqBoundary(t *testing.T) {
	ctx := context.Background()
	e, err := Open(t.TempDir(), Options{ExpungeWindow: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	inbox := storetest.UserInbox(t, e, "b@example.test")
	uids := appendBulk(t, e, inbox.ID, pruneBatch+500)
	// Expunges below the bulk STORE, so that the prune has to read through it.
	early := appendOne(t, e, inbox.ID, "early\r\n")
	if _, _, err := writer(e).Expunge(ctx, inbox.ID, []uint32{early.UID}); err != nil {
		t.Fatal(err)
	}
	res, err := writer(e).SetFlags(ctx, inbox.ID, store.FlagChange{UIDs: uids, Op: store.FlagsAdd, Flags: []string{`\Seen`}})
	if err != nil || len(res.Changed) != len(uids) {
		t.Fatalf("SetFlags: %d changed, %v", len(res.Changed), err)
	}
	bulkAt := res.Changed[0].ModSeq
	// The next expunge's prune reads the bulk STORE's entries, more than
	// pruneBatch at one MODSEQ, all of them, and stops there.
	one := appendOne(t, e, inbox.ID, "one\r\n")
	if _, _, err := writer(e).Expunge(ctx, inbox.ID, []uint32{one.UID}); err != nil {
		t.Fatal(err)
	}
	mb, err := e.GetMailboxByID(ctx, inbox.ID)
	if err != nil {
		t.Fatal(err)
	}
	if mb.ExpungeFloor != bulkAt {
		t.Fatalf("floor %d, want the bulk STORE's modseq %d (highest %d)", mb.ExpungeFloor, bulkAt, mb.HighestModSeq)
	}
	if all, n := logEntries(t, e, inbox.ID); n != 1 || all != len(uids)+1 {
		t.Fatalf("%d entries, %d of them expunges; want the bulk STORE's and one's expunge", all, n)
	}
	changes, err := e.Changes(ctx, inbox.ID, bulkAt, 10)
	if err != nil || len(changes) != 1 || changes[0].UID != one.UID || changes[0].Kind != store.ChangeExpunged {
		t.Fatalf("changes since the floor: %+v, %v", changes, err)
	}
	checkClean(t, e)
}

// appendBulk appends n messages sharing one blob to mbox in one call and
// returns their UIDs.
func appendBulk(t *testing.T, e *Engine, mbox store.ID, n int) []uint32 {
	t.Helper()
	ctx := context.Background()
	blob, size, err := e.PutBlob(ctx, strings.NewReader("bulk\r\n"), 0)
	if err != nil {
		t.Fatal(err)
	}
	nms := make([]store.NewMessage, n)
	for i := range nms {
		nms[i] = store.NewMessage{Blob: blob, Size: size, InternalDate: time.Now()}
	}
	msgs, err := writer(e).Append(ctx, mbox, nms, store.AppendOptions{})
	if err != nil {
		t.Fatal(err)
	}
	uids := make([]uint32, len(msgs))
	for i, m := range msgs {
		uids[i] = m.UID
	}
	return uids
}

// TestExpungeEntries: one expunge's UIDs share change log entries, runs of
// consecutive UIDs encoded as ranges and at most maxExpungedPerEntry UIDs
// to an entry, and Changes returns each UID, across a reopen.
func TestExpungeEntries(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	e := open(t, dir)
	inbox := storetest.UserInbox(t, e, "c@example.test")
	uids := appendBulk(t, e, inbox.ID, 2*maxExpungedPerEntry+300)
	// Every third UID stays: the rest are runs of two.
	var gone, kept []uint32
	for i, uid := range uids {
		if i%3 != 2 {
			gone = append(gone, uid)
		} else {
			kept = append(kept, uid)
		}
	}
	expunged, at, err := writer(e).Expunge(ctx, inbox.ID, gone)
	if err != nil || len(expunged) != len(gone) {
		t.Fatalf("Expunge: %d gone, %v", len(expunged), err)
	}
	mb, err := e.GetMailboxByID(ctx, inbox.ID)
	if err != nil {
		t.Fatal(err)
	}
	want := (len(gone) + maxExpungedPerEntry - 1) / maxExpungedPerEntry
	for round := range 2 {
		if _, n := logEntries(t, e, inbox.ID); n != want {
			t.Fatalf("%d expunge entries for %d UIDs, want %d", n, len(gone), want)
		}
		changes, err := e.Changes(ctx, inbox.ID, mb.HighestModSeq-1, 1)
		if err != nil || len(changes) != len(gone) {
			t.Fatalf("Changes: %d, %v; want the %d expunges of modseq %d", len(changes), err, len(gone), at)
		}
		for i, c := range changes {
			if c != (store.Change{ModSeq: at, UID: gone[i], Kind: store.ChangeExpunged}) {
				t.Fatalf("change %d = %+v, want uid %d expunged at %d", i, c, gone[i], at)
			}
		}
		checkClean(t, e)
		if round == 0 {
			if err := e.Close(); err != nil {
				t.Fatal(err)
			}
			e = open(t, dir)
		}
	}
	defer e.Close()
	msgs, err := e.ListMessages(ctx, inbox.ID, 1, len(uids))
	if err != nil || len(msgs) != len(kept) {
		t.Fatalf("ListMessages after the expunge: %d messages, %v; want %d", len(msgs), err, len(kept))
	}
	for i, m := range msgs {
		if m.UID != kept[i] {
			t.Fatalf("message %d has UID %d, want %d", i, m.UID, kept[i])
		}
	}
}
