package cassandra

import (
	"context"
	"slices"
	"strings"
	"testing"

	"quill/internal/store"
	"quill/internal/store/storetest"
)

// changeRows lists the change log rows of a mailbox's buckets 0..last as
// MODSEQs, ascending.
func changeRows(t *testing.T, e *Engine, mailbox store.ID, last int) []int64 {
	t.Helper()
	var out []int64
	for b := 0; b <= last; b++ {
		it := e.read(context.Background(), `SELECT modseq FROM changes WHERE mailbox = ? AND bucket = ?`, mailbox[:], b).Iter()
		var ms int64
		for it.Scan(&ms) {
			out = append(out, ms)
		}
		if err := it.Close(); err != nil {
			t.Fatal(err)
		}
	}
	return out
}

// TestExpungesPruned runs the conformance test of forgotten expunges
// (storetest.ExpungeFloor) on the cluster, then repeats the last prune's
// deletes, as a roll-forward of that expunge would: nothing changes.
func TestExpungesPruned(t *testing.T) {
	const window = 8
	opts := testOptions(newKeyspace(t))
	opts.ExpungeWindow = window
	e, err := Open(context.Background(), opts)
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	mb := storetest.ExpungeFloor(t, e, window, func(mailbox store.ID) int {
		h, err := e.readHead(context.Background(), mailbox, false)
		if err != nil {
			t.Fatal(err)
		}
		return len(changeRows(t, e, mailbox, bucketOf(uint64(h.modSeq))))
	})
	before := changeRows(t, e, mb.ID, bucketOf(mb.HighestModSeq))
	if err := e.pruneChanges(context.Background(), mb.ID, 0, int64(mb.ExpungeFloor), int64(mb.HighestModSeq)); err != nil {
		t.Fatal(err)
	}
	if after := changeRows(t, e, mb.ID, bucketOf(mb.HighestModSeq)); !slices.Equal(before, after) {
		t.Fatalf("rows %v after repeating the prune, %v before", after, before)
	}
}

// TestPruneChangesAcrossBuckets deletes (from, to] over four change log
// partitions: part of the first, the two between whole (partition
// deletes), part of the last. Rows on either side stay.
func TestPruneChangesAcrossBuckets(t *testing.T) {
	ctx := context.Background()
	e := openTest(t, newKeyspace(t))
	defer e.Close()
	mailbox := store.NewID()
	const span = 1 << bucketBits
	modseqs := []int64{1, 5, span - 1, span, span + 7, 2*span - 1, 2 * span, 3 * span, 3*span + 3, 3*span + 4, 4 * span}
	for _, ms := range modseqs {
		if err := e.write(ctx, `INSERT INTO changes (mailbox, bucket, modseq, uid, kind) VALUES (?, ?, ?, ?, ?)`,
			mailbox[:], bucketOf(uint64(ms)), ms, ms, int8(store.ChangeExpunged)).WithTimestamp(ms).Exec(); err != nil {
			t.Fatal(err)
		}
	}
	const from, to = 5, 3*span + 3
	if err := e.pruneChanges(ctx, mailbox, from, to, 4*span+1); err != nil {
		t.Fatal(err)
	}
	got := changeRows(t, e, mailbox, bucketOf(4*span))
	if want := []int64{1, 5, 3*span + 4, 4 * span}; !slices.Equal(got, want) {
		t.Fatalf("rows left %v, want %v", got, want)
	}
}

// TestRaisedFloor: the floor trails the expunge's MODSEQ by the window
// once twice the window has built up, and one expunge deletes at most
// pruneBuckets partitions.
func TestRaisedFloor(t *testing.T) {
	e := &Engine{opts: Options{ExpungeWindow: 1024}}
	const span = 1 << bucketBits
	for _, c := range []struct{ floor, m, want int64 }{
		{0, 2047, 0},
		{0, 2048, 1024},
		{1024, 3071, 1024},
		{1024, 3072, 2048},
		{0, 1000 * span, pruneBuckets*span - 1},
		{pruneBuckets*span - 1, 1000 * span, 2*pruneBuckets*span - 1},
		{990*span - 1, 1000 * span, 1000*span - 1024},
	} {
		if got := e.raisedFloor(c.floor, c.m); got != c.want {
			t.Errorf("raisedFloor(%d, %d) = %d, want %d", c.floor, c.m, got, c.want)
		}
	}
}

// TestMigrationAddsExpungeFloor opens a keyspace at schema version 1, as a
// binary before the expunge floor left it, with a mailbox in it; the next
// Open migrates it, the mailbox reads with floor 0 and prunes from there,
// and running the ALTER again (another process migrating at the same
// moment) is not an error.
func TestMigrationAddsExpungeFloor(t *testing.T) {
	ctx := context.Background()
	ks := newKeyspace(t)
	all := migrations
	migrations = migrations[:2]
	old, err := Open(ctx, testOptions(ks))
	migrations = all
	if err != nil {
		t.Fatal(err)
	}
	if _, _, ok := addedColumn(migrations[2][0]); !ok {
		t.Fatalf("migration 2 is not an added column: %q", migrations[2][0])
	}
	// A version-1 head, written with version-1 columns.
	id := store.NewID()
	if err := old.write(ctx, `INSERT INTO mailboxes (id, address, name, subscribed, uidvalidity, uidnext, modseq, messages, size) VALUES (?, 'm@example.test', 'INBOX', true, 1, 1, 1, 0, 0)`,
		id[:]).Exec(); err != nil {
		t.Fatal(err)
	}
	old.Close()

	opts := testOptions(ks)
	opts.ExpungeWindow = 1
	e, err := Open(ctx, opts)
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	mb, err := e.GetMailboxByID(ctx, id)
	if err != nil || mb.ExpungeFloor != 0 || mb.HighestModSeq != 1 {
		t.Fatalf("migrated mailbox = %+v, %v", mb, err)
	}
	for range 2 {
		blob, n, err := e.PutBlob(ctx, strings.NewReader("m\r\n"), 0)
		if err != nil {
			t.Fatal(err)
		}
		msgs, err := e.Append(ctx, id, []store.NewMessage{{Blob: blob, Size: n}}, store.AppendOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if _, _, err := e.Expunge(ctx, id, []uint32{msgs[0].UID}); err != nil {
			t.Fatal(err)
		}
	}
	if mb, err = e.GetMailboxByID(ctx, id); err != nil || mb.ExpungeFloor == 0 {
		t.Fatalf("after expunges: %+v, %v; want the floor raised", mb, err)
	}
	if err := e.runMigration(ctx, migrations[2][0]); err != nil {
		t.Fatalf("adding the column again: %v", err)
	}
}
