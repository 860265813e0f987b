package cassandra

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

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
		b := openTest(t, newKeyspace(t)).Batches()
		// The suite waits for blobs to be released after expunges: a
		// shorter grace keeps it quick.
		b.grace = 4 * time.Second
		return usermgr.New(b, usermgr.Options{})
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
	inbox := storetest.UserInbox(t, b1, user)
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

// TestWindow: a writer goes at most a window beyond the head it last read
// back with its own epoch. One that keeps writing after another adopted
// its mailbox (ignoring its lease) is stopped at the end of its window;
// one whose manager skipped numbers (failed batches never reuse theirs)
// bridges the gap with a head write and goes on.
func TestWindow(t *testing.T) {
	ctx := context.Background()
	ks := newKeyspace(t)
	ea, eb := openTest(t, ks), openTest(t, ks)
	defer ea.Close()
	defer eb.Close()
	ba, bb := ea.Batches(), eb.Batches()
	ba.win = 8
	if err := ba.CreateUser(ctx, store.User{Address: "w@example.test"}); err != nil {
		t.Fatal(err)
	}
	inbox, err := ba.GetMailbox(ctx, "w@example.test", "INBOX")
	if err != nil {
		t.Fatal(err)
	}
	ma := usermgr.New(ba, usermgr.Options{Owner: epochOwner(1)})
	mb := usermgr.New(bb, usermgr.Options{Owner: epochOwner(2)})
	one := func(m *usermgr.Manager, mbox store.ID, body string) error {
		_, err := m.Append(ctx, mbox, []store.NewMessage{{Body: []byte(body), Size: int64(len(body))}}, store.AppendOptions{})
		return err
	}
	for i := 0; i < 3; i++ {
		if err := one(ma, inbox.ID, "a"); err != nil {
			t.Fatal(err)
		}
	}
	if err := one(mb, inbox.ID, "b"); err != nil {
		t.Fatal(err)
	}
	late := 0
	for ; late < 20; late++ {
		err := one(ma, inbox.ID, "late")
		if errors.Is(err, store.ErrConflict) {
			break
		}
		if err != nil {
			t.Fatalf("late append %d: %v", late, err)
		}
	}
	if late == 20 || late > int(ba.win) {
		t.Fatalf("the deposed writer wrote %d batches after the takeover; its window is %d", late, ba.win)
	}
	if err := one(ma, inbox.ID, "late"); !errors.Is(err, store.ErrConflict) {
		t.Fatalf("append after deposition: %v, want ErrConflict", err)
	}
	if msgs, err := mb.ListMessages(ctx, inbox.ID, 1, 100); err != nil || len(msgs) != 4 {
		t.Fatalf("messages = %d, %v; want the 4 acknowledged before and after the takeover", len(msgs), err)
	}

	// Skipped numbers: appends of a missing blob fail after their rows,
	// and the manager never reuses their UIDs. (Another keyspace: the
	// deposed writer's fenced bodies above are a leak Check reports.)
	es := openTest(t, newKeyspace(t))
	defer es.Close()
	bs := es.Batches()
	bs.win = 8
	if err := bs.CreateUser(ctx, store.User{Address: "s@example.test"}); err != nil {
		t.Fatal(err)
	}
	sb, err := bs.GetMailbox(ctx, "s@example.test", "INBOX")
	if err != nil {
		t.Fatal(err)
	}
	ma = usermgr.New(bs, usermgr.Options{})
	for i := 0; i < 12; i++ {
		_, err := ma.Append(ctx, sb.ID, []store.NewMessage{{Blob: store.NewID(), Size: 1}}, store.AppendOptions{})
		if !errors.Is(err, store.ErrNotFound) {
			t.Fatalf("append of a missing blob: %v", err)
		}
	}
	if err := one(ma, sb.ID, "after the gap"); err != nil {
		t.Fatalf("append beyond the window after failures: %v", err)
	}
	h, err := bs.GetMailboxByID(ctx, sb.ID)
	if err != nil || h.Messages != 1 || h.UIDNext <= 13 {
		t.Fatalf("mailbox after the gap = %+v, %v", h, err)
	}
	problems, err := ma.Check(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Error(p)
	}
}

// TestModeReported: Mode reports what a keyspace holds without recording
// anything, ClaimMode records a mode once, and a keyspace of the ordered
// mode from before the record reports ModeOrdered and refuses a claim of
// the batch mode (what `quill cluster init` and the server rely on).
func TestModeReported(t *testing.T) {
	if off {
		t.Skip("QUILL_CASSANDRA=off")
	}
	ctx := context.Background()
	ks := newKeyspace(t)
	e1, e2 := openTest(t, ks), openTest(t, ks)
	defer e1.Close()
	defer e2.Close()
	if m, err := e1.Mode(ctx); err != nil || m != ModeNone {
		t.Fatalf("Mode of a new keyspace = %q, %v; want none", m, err)
	}
	if m, err := e1.Mode(ctx); err != nil || m != ModeNone {
		t.Fatalf("Mode read twice = %q, %v; want none (Mode records nothing)", m, err)
	}
	if err := e1.ClaimMode(ctx, ModeBatches); err != nil {
		t.Fatalf("ClaimMode(batches): %v", err)
	}
	if err := e1.ClaimMode(ctx, ModeBatches); err != nil {
		t.Fatalf("ClaimMode(batches) again: %v", err)
	}
	if m, err := e2.Mode(ctx); err != nil || m != ModeBatches {
		t.Fatalf("Mode in another engine = %q, %v; want batches", m, err)
	}
	if err := e2.ClaimMode(ctx, ModeOrdered); !errors.Is(err, ErrModeMismatch) {
		t.Fatalf("ClaimMode(ordered) on a batch keyspace: %v, want ErrModeMismatch", err)
	}
	if err := e2.ClaimMode(ctx, "other"); !errors.Is(err, store.ErrInvalid) {
		t.Fatalf("ClaimMode(other): %v, want ErrInvalid", err)
	}

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
	if m, err := e4.Mode(ctx); err != nil || m != ModeOrdered {
		t.Fatalf("Mode of an ordered keyspace without a record = %q, %v; want ordered", m, err)
	}
	if err := e4.ClaimMode(ctx, ModeBatches); !errors.Is(err, ErrModeMismatch) {
		t.Fatalf("ClaimMode(batches) on an old ordered keyspace: %v, want ErrModeMismatch", err)
	}
}

// TestHeadWriteFailureIsUnknown: a batch whose rows were written but whose
// head write failed may be visible (the write may have landed), so it is
// reported of unknown outcome (ADR 0030), never as failed. The head write
// is made to fail by dropping a head column under the writer.
func TestHeadWriteFailureIsUnknown(t *testing.T) {
	ctx := context.Background()
	ks := newKeyspace(t)
	e := openTest(t, ks)
	defer e.Close()
	b := e.Batches()
	const user = "h@example.test"
	inbox := storetest.UserInbox(t, b, user)
	m := usermgr.New(b, usermgr.Options{})
	if _, err := m.Append(ctx, inbox.ID, []store.NewMessage{{Body: []byte("first"), Size: 5}}, store.AppendOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := e.s.Query(`ALTER TABLE bmailboxes DROP size`).Exec(); err != nil {
		t.Fatal(err)
	}
	_, err := m.Append(ctx, inbox.ID, []store.NewMessage{{Body: []byte("second"), Size: 6}}, store.AppendOptions{})
	if !errors.Is(err, store.ErrOutcomeUnknown) {
		t.Fatalf("append whose head write failed: %v; want store.ErrOutcomeUnknown", err)
	}
}

// collectDue waits until the collector has nothing due left to collect: what
// it still holds waits for its grace.
func collectDue(t *testing.T, c *collector) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		c.mu.Lock()
		due := c.busy
		for _, it := range c.queue {
			due = due || !it.due.After(time.Now())
		}
		c.mu.Unlock()
		if !due {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("the collector still has due garbage after a minute")
		}
		time.Sleep(10 * time.Millisecond) // paces the polling of an observable condition
	}
}

// TestChangesSeeTheirHead: a change log read that read the head before a
// flag change superseded a message's version still finds that version
// (the cluster-mode long run saw an IMAP session miss a message this
// way, then take it for expunged: a UID seen out of order; additions are
// now derived from message rows, which a flag change leaves, so the case
// is a flag version superseded by another). The collector keeps
// superseded versions for a grace; with no grace the read misses the
// version, which shows the grace is what keeps it.
func TestChangesSeeTheirHead(t *testing.T) {
	for _, tc := range []struct {
		grace time.Duration
		seen  bool
	}{{defaultGrace, true}, {0, false}} {
		t.Run(fmt.Sprintf("grace=%v", tc.grace), func(t *testing.T) {
			ctx := context.Background()
			b := openBatches(t, newKeyspace(t))
			defer b.Close()
			b.grace = tc.grace
			const user = "c@example.test"
			inbox := storetest.UserInbox(t, b, user)
			m := usermgr.New(b, usermgr.Options{})
			if _, err := m.Append(ctx, inbox.ID, []store.NewMessage{{Body: []byte("one"), Size: 3}}, store.AppendOptions{}); err != nil {
				t.Fatal(err)
			}
			flag := func(f string) uint64 {
				t.Helper()
				res, err := m.SetFlags(ctx, inbox.ID, store.FlagChange{UIDs: []uint32{1}, Op: store.FlagsAdd, Flags: []string{f}})
				if err != nil || len(res.Changed) != 1 {
					t.Fatalf("SetFlags(%s) = %+v, %v", f, res, err)
				}
				return res.Changed[0].ModSeq
			}
			seenAt := flag(`\Seen`)
			h, err := b.readHead(ctx, inbox.ID, false)
			if err != nil {
				t.Fatal(err)
			}
			flag(`\Flagged`)
			collectDue(t, b.gc)
			out, err := b.changesAt(ctx, inbox.ID, 0, 100, h)
			if err != nil {
				t.Fatal(err)
			}
			seen := slices.Equal(out, []store.Change{{ModSeq: seenAt, UID: 1, Kind: store.ChangeFlags}})
			if seen != tc.seen {
				t.Fatalf("changes at the head read before the second flag change = %+v; its version at MODSEQ %d seen: %v, want %v", out, seenAt, seen, tc.seen)
			}
		})
	}
}

// TestReferencedBlobsAreUnmarked: the pending marks of bodies stored by
// PutBlob (a forwarded delivery's, an APPEND's) go once a batch that
// references them is written, many per statement; a body no batch
// references keeps its mark for the reclaimer.
func TestReferencedBlobsAreUnmarked(t *testing.T) {
	ctx := context.Background()
	e := openTest(t, newKeyspace(t))
	defer e.Close()
	b := e.Batches()
	const user = "u@example.test"
	inbox := storetest.UserInbox(t, b, user)
	marked := func(id store.ID) bool {
		t.Helper()
		n := 0
		if err := e.s.Query(`SELECT COUNT(*) FROM pending_blobs WHERE shard = ? AND id = ?`, blobShard(id), id[:]).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n > 0
	}
	put := func(body string) store.ID {
		t.Helper()
		id, _, err := b.PutBlob(ctx, strings.NewReader(body), int64(len(body)))
		if err != nil {
			t.Fatal(err)
		}
		if !marked(id) {
			t.Fatalf("blob %s stored without its pending mark", id)
		}
		return id
	}
	var msgs []store.NewMessage
	for i := range 40 { // more than one blob in some shards
		body := fmt.Sprintf("message %d", i)
		msgs = append(msgs, store.NewMessage{Blob: put(body), Size: int64(len(body)), FreshBlob: true})
	}
	orphan := put("never delivered")
	m := usermgr.New(b, usermgr.Options{})
	if _, err := m.Append(ctx, inbox.ID, msgs[:1], store.AppendOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := m.Append(ctx, inbox.ID, msgs[1:], store.AppendOptions{}); err != nil {
		t.Fatal(err)
	}
	collectDue(t, b.gc)
	for i, nm := range msgs {
		if marked(nm.Blob) {
			t.Errorf("message %d: its blob is still marked pending after its batch", i)
		}
	}
	if !marked(orphan) {
		t.Error("a blob no message references lost its pending mark")
	}
}
