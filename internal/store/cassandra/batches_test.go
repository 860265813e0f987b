package cassandra

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"quill/internal/store"
	"quill/internal/store/storetest"
	"quill/internal/usermgr"
)

// TestBatchesConformance runs storetest through the user manager over the
// batch mode (ADR 0026): the manager builds every mailbox write, the
// engine applies it as a fenced batch without a conditional write.
func TestBatchesConformance(t *testing.T) {
	if off {
		t.Skip("QUILL_CASSANDRA=off")
	}
	storetest.Run(t, func(t *testing.T) store.Store {
		return usermgr.New(openTest(t, newKeyspace(t)).Batches(), usermgr.Options{})
	})
}

func openBatches(t testing.TB, ks string) *Batches {
	t.Helper()
	return openTest(t, ks).Batches()
}

// TestModesDoNotMix: a keyspace holds the mailboxes of one mode; the
// other mode's mailbox calls fail with ErrModeMismatch, in the same
// process and in another, and a keyspace of the ordered mode written
// before the mode was recorded is refused to the batch mode.
func TestModesDoNotMix(t *testing.T) {
	ctx := context.Background()
	ks := newKeyspace(t)
	e1, e2 := openTest(t, ks), openTest(t, ks)
	defer e1.Close()
	defer e2.Close()
	if err := e1.Batches().CreateUser(ctx, store.User{Address: "b@example.test"}); err != nil {
		t.Fatal(err)
	}
	for name, err := range map[string]error{
		"ordered GetMailbox, same engine":  func() error { _, err := e1.GetMailbox(ctx, "b@example.test", "INBOX"); return err }(),
		"ordered CreateUser, other engine": e2.CreateUser(ctx, store.User{Address: "o@example.test"}),
	} {
		if !errors.Is(err, ErrModeMismatch) || !errors.Is(err, store.ErrConflict) {
			t.Errorf("%s: %v, want ErrModeMismatch", name, err)
		}
	}
	if _, err := e2.Batches().GetMailbox(ctx, "b@example.test", "INBOX"); err != nil {
		t.Fatalf("batch mode in another engine: %v", err)
	}

	// An ordered keyspace from before the record: its mailboxes, no mode.
	ks2 := newKeyspace(t)
	e3 := openTest(t, ks2)
	defer e3.Close()
	if err := e3.CreateUser(ctx, store.User{Address: "o@example.test"}); err != nil {
		t.Fatal(err)
	}
	if err := e3.s.Query(`DELETE FROM keyspace_mode WHERE k = 0`).Exec(); err != nil {
		t.Fatal(err)
	}
	e4 := openTest(t, ks2)
	defer e4.Close()
	if _, err := e4.Batches().GetMailbox(ctx, "o@example.test", "INBOX"); !errors.Is(err, ErrModeMismatch) {
		t.Fatalf("batch mode on an old ordered keyspace: %v, want ErrModeMismatch", err)
	}
}

// TestRestartWithinEpoch: a single node is at epoch 1 for good, so a
// process that restarts writes at the epoch of the one before it. Rows
// the dead process left above the head (a batch whose head it never
// wrote, stamped with counters above the head's) must not show once the
// new process writes those UIDs: the adoption fences above the stored
// head's counter plus the window, and the new process counts from there.
func TestRestartWithinEpoch(t *testing.T) {
	ctx := context.Background()
	ks := newKeyspace(t)
	e1 := openTest(t, ks)
	b1 := e1.Batches()
	const user = "r@example.test"
	if err := b1.CreateUser(ctx, store.User{Address: user}); err != nil {
		t.Fatal(err)
	}
	inbox, err := b1.GetMailbox(ctx, user, "INBOX")
	if err != nil {
		t.Fatal(err)
	}
	m1 := usermgr.New(b1, usermgr.Options{})
	for i := 0; i < 3; i++ {
		body := fmt.Sprintf("first %d", i)
		if _, err := m1.Append(ctx, inbox.ID, []store.NewMessage{{Body: []byte(body), Size: int64(len(body))}}, store.AppendOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	h, err := b1.readHead(ctx, inbox.ID, true)
	if err != nil {
		t.Fatal(err)
	}
	// The batch in flight when the process died: rows of UID UIDNEXT at
	// the next counters, no head.
	leftover := base(1) + h.n + 5
	leftBlob := store.NewID()
	if err := e1.s.Query(`INSERT INTO bmessages (mailbox, bucket, uid, modseq, added, flags, size, blob, meta) VALUES (?, 0, ?, 0, ?, '\Deleted', 4, ?, ?)`,
		inbox.ID[:], int64(h.UIDNext), int64(h.HighestModSeq+1), leftBlob[:], []byte("leftover")).
		WithTimestamp(leftover).Exec(); err != nil {
		t.Fatal(err)
	}
	if err := e1.s.Query(`INSERT INTO bchanges (mailbox, bucket, section, modseq, uid, kind, flags) VALUES (?, 0, 0, ?, ?, 1, '\Deleted')`,
		inbox.ID[:], int64(h.HighestModSeq+1), int64(h.UIDNext)).WithTimestamp(leftover).Exec(); err != nil {
		t.Fatal(err)
	}
	e1.Close()

	e2 := openTest(t, ks)
	defer e2.Close()
	m2 := usermgr.New(e2.Batches(), usermgr.Options{})
	out, err := m2.Append(ctx, inbox.ID, []store.NewMessage{{Body: []byte("after restart"), Size: 13}}, store.AppendOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if out[0].UID != h.UIDNext {
		t.Fatalf("append after restart got UID %d, want %d", out[0].UID, h.UIDNext)
	}
	got, err := m2.GetMessage(ctx, inbox.ID, out[0].UID)
	if err != nil {
		t.Fatal(err)
	}
	if got.Meta != nil || len(got.Flags) != 0 || got.Size != 13 || got.Blob != out[0].Blob {
		t.Fatalf("message after restart = %+v: the dead process's leftover shows", got)
	}
	problems, err := m2.Check(ctx)
	if err != nil || len(problems) > 0 {
		t.Fatalf("Check = %v, %v", problems, err)
	}
}
