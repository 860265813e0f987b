package embedded

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"reflect"
	"testing"
	"time"

	"quill/internal/store"
	"quill/internal/store/embedded/overlay"
	"quill/internal/store/storetest"
)

// The store's contract holds whatever the overlay holds: with checkpoints
// every millisecond (records move to Pebble while the suite reads them)
// and with none (everything is read from the overlay), and without the
// list cache, so that listings merge the overlay with Pebble (spanView).
func TestConformanceOverlay(t *testing.T) {
	for _, every := range []time.Duration{time.Millisecond, time.Hour} {
		t.Run("checkpoint-"+every.String(), func(t *testing.T) {
			storetest.Run(t, func(t *testing.T) store.Store {
				e, err := Open(t.TempDir(), Options{ListCacheBytes: -1, CheckpointInterval: every})
				if err != nil {
					t.Fatal(err)
				}
				return writer(e)
			})
		})
	}
}

// A message delivered and expunged between two checkpoints never reaches
// Pebble: its message, change and blob records cancel in the overlay, and
// the checkpoint applies only the counters and the expunge's change entry.
func TestCheckpointCancelsShortLived(t *testing.T) {
	ctx := context.Background()
	e, err := Open(t.TempDir(), Options{CheckpointInterval: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	inbox := storetest.UserInbox(t, e, "short@example.test")
	if err := e.checkpoint("test"); err != nil {
		t.Fatal(err)
	}
	before := e.pend.Stats()
	const n = 50
	for i := range n {
		body := []byte(fmt.Sprintf("message %d\r\n", i))
		msgs, err := writer(e).Append(ctx, inbox.ID, []store.NewMessage{{Body: body, Size: int64(len(body))}}, store.AppendOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if _, _, err := writer(e).Expunge(ctx, inbox.ID, []uint32{msgs[0].UID}); err != nil {
			t.Fatal(err)
		}
	}
	if err := e.checkpoint("test"); err != nil {
		t.Fatal(err)
	}
	after := e.pend.Stats()
	cancelled, applied := after.Cancelled-before.Cancelled, after.Applied-before.Applied
	// Per message: message, added entry and blob records.
	if cancelled < 3*n {
		t.Errorf("%d records cancelled, want at least %d", cancelled, 3*n)
	}
	// The mailbox, usage and log position records, and one expunge entry
	// per message (pruned only past ExpungeWindow).
	if applied > n+3 {
		t.Errorf("%d records applied to Pebble, want at most %d", applied, n+3)
	}
	if after.Bytes != 0 {
		t.Errorf("overlay holds %d bytes after a checkpoint", after.Bytes)
	}
	checkClean(t, e)
}

// Listings and change logs read the same from the overlay over Pebble,
// after a checkpoint, and after a reopen. The state mixes records in
// Pebble with the overlay's deletions, rewrites and new records of them.
func TestOverlayViews(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	opts := Options{ListCacheBytes: -1, CheckpointInterval: time.Hour}
	e, err := Open(dir, opts)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { e.Close() }()
	inbox := storetest.UserInbox(t, e, "views@example.test")
	uids := appendBulk(t, e, inbox.ID, 10)
	if err := e.checkpoint("test"); err != nil {
		t.Fatal(err)
	}
	// In the overlay: two expunged, one flagged, three new.
	if _, _, err := writer(e).Expunge(ctx, inbox.ID, uids[1:3]); err != nil {
		t.Fatal(err)
	}
	if _, err := writer(e).SetFlags(ctx, inbox.ID, store.FlagChange{UIDs: uids[3:4], Op: store.FlagsAdd, Flags: []string{`\Seen`}}); err != nil {
		t.Fatal(err)
	}
	appendBulk(t, e, inbox.ID, 3)

	type reads struct {
		All, Middle, New []store.Message
		Changes          []store.Change
	}
	read := func() reads {
		t.Helper()
		var r reads
		var err error
		if r.All, err = e.ListMessages(ctx, inbox.ID, 1, 1<<20); err != nil {
			t.Fatal(err)
		}
		if r.Middle, err = e.ListMessages(ctx, inbox.ID, uids[1], 3); err != nil {
			t.Fatal(err)
		}
		if r.New, err = e.ListMessages(ctx, inbox.ID, uids[9]+1, 10); err != nil {
			t.Fatal(err)
		}
		if r.Changes, err = e.Changes(ctx, inbox.ID, 0, 1<<20); err != nil {
			t.Fatal(err)
		}
		return r
	}
	overlaid := read()
	var got []uint32
	for _, m := range overlaid.All {
		got = append(got, m.UID)
	}
	want := []uint32{1, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("listing over the overlay: UIDs %v, want %v", got, want)
	}
	if len(overlaid.All[1].Flags) != 1 || len(overlaid.Middle) != 3 || overlaid.Middle[0].UID != 4 || len(overlaid.New) != 3 {
		t.Fatalf("listing over the overlay: %+v", overlaid)
	}
	if err := e.checkpoint("test"); err != nil {
		t.Fatal(err)
	}
	if checkpointed := read(); !reflect.DeepEqual(checkpointed, overlaid) {
		t.Fatalf("after a checkpoint:\n%+v\nover the overlay:\n%+v", checkpointed, overlaid)
	}
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	if e, err = Open(dir, opts); err != nil {
		t.Fatal(err)
	}
	if reopened := read(); !reflect.DeepEqual(reopened, overlaid) {
		t.Fatalf("after a reopen:\n%+v\nover the overlay:\n%+v", reopened, overlaid)
	}
	checkClean(t, e)
}

// BenchmarkOverlayMerge feeds the overlay what the mix's commit groups
// write per delivered message (message, change and blob records inserted;
// the mailbox and usage records rewritten) and per retrieval (the three
// deleted, an expunge entry inserted), retrieving each message lag
// messages after its delivery, with a checkpoint's reset every 40,000
// messages (5 s at 8,000 msg/s: a checkpoint that applies nothing).
// Reported per message; the writes are built before the timer starts.
func BenchmarkOverlayMerge(b *testing.B) {
	for _, lag := range []int{1000, 100000} {
		b.Run(fmt.Sprintf("lag%d", lag), func(b *testing.B) {
			const perLayer, msgs = 40000, 200000
			mboxes := make([]store.ID, 1000)
			for i := range mboxes {
				mboxes[i] = store.NewID()
			}
			keysOf := func(i int) [3][]byte {
				box := mboxes[i%len(mboxes)]
				blob := store.ID{}
				binary.BigEndian.PutUint64(blob[:], uint64(i))
				return [3][]byte{messageKey(box, uint32(i)), changeKey(box, uint64(i), uint32(i)), blobKey(blob)}
			}
			val := make([]byte, 40)
			usage := usageKey("user@example.test")
			groups := make([][]overlay.Write, msgs)
			for i := range groups {
				box := mboxes[i%len(mboxes)]
				var ops []overlay.Write
				for _, k := range keysOf(i) {
					ops = append(ops, overlay.Write{Key: k, Value: val, Fresh: true})
				}
				ops = append(ops, overlay.Write{Key: mailboxKey(box), Value: val}, overlay.Write{Key: usage, Value: val})
				if j := i - lag; j >= 0 {
					for _, k := range keysOf(j) {
						ops = append(ops, overlay.Write{Key: k, Del: true})
					}
					ops = append(ops, overlay.Write{Key: changeKey(mboxes[j%len(mboxes)], uint64(i)<<20, uint32(j)), Value: val, Fresh: true})
				}
				groups[i] = ops
			}
			o := overlay.New(keySchema)
			drop := func(*overlay.Layer) error { return nil }
			for i := 0; b.Loop(); i++ {
				if i%perLayer == 0 {
					o.Checkpoint(drop)
				}
				o.Merge(groups[i%msgs])
			}
		})
	}
}

// TestGroupReadsAfterRangeDelete: the group's batch is not indexed, so a
// transaction that follows a range delete in the same group must not see
// the keys Pebble still holds in the range, and must see what the group
// wrote into it afterwards, by point reads and by scans.
func TestGroupReadsAfterRangeDelete(t *testing.T) {
	ctx := context.Background()
	e, err := Open(t.TempDir(), Options{CheckpointInterval: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	box := store.NewID()
	p := append([]byte{tChange}, box[:]...)
	k1, k2, k3 := changeKey(box, 1, 1), changeKey(box, 2, 2), changeKey(box, 3, 3)
	if err := e.update(ctx, func(t *txn) error { t.set(k1, []byte("1")); t.set(k2, []byte("2")); return nil }); err != nil {
		t.Fatal(err)
	}
	if err := e.checkpoint("test"); err != nil {
		t.Fatal(err)
	}
	// k1 is rewritten in the overlay: the range delete must checkpoint it
	// first, or it would come back.
	if err := e.update(ctx, func(t *txn) error { t.set(k1, []byte("1b")); return nil }); err != nil {
		t.Fatal(err)
	}

	// Hold the committer in a group of its own, so that the two requests
	// queued meanwhile form the next group together.
	started, release := make(chan struct{}), make(chan struct{})
	hold, err := e.submit(ctx, func(*txn) error { close(started); <-release; return nil })
	if err != nil {
		t.Fatal(err)
	}
	<-started
	del, err := e.submit(ctx, func(t *txn) error {
		t.deletePrefix(p)
		t.set(k3, []byte("3"))
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	var point [3]string
	var scanned []string
	read, err := e.submit(ctx, func(t *txn) error {
		for i, k := range [][]byte{k1, k2, k3} {
			v, err := t.get(k)
			switch {
			case errors.Is(err, store.ErrNotFound):
				point[i] = "-"
			case err != nil:
				return err
			default:
				point[i] = string(v)
			}
		}
		return t.scan(p, func(_, v []byte) error { scanned = append(scanned, string(v)); return nil })
	})
	if err != nil {
		t.Fatal(err)
	}
	before := sampleCount(t, e)
	close(release)
	for _, r := range []*request{hold, del, read} {
		if err := r.wait(); err != nil {
			t.Fatal(err)
		}
	}
	if groups := sampleCount(t, e) - before; groups != 2 {
		t.Fatalf("%d commit groups, want 2 (the held one, then both requests)", groups)
	}
	if point != [3]string{"-", "-", "3"} || !reflect.DeepEqual(scanned, []string{"3"}) {
		t.Fatalf("after the range delete in the same group: point reads %q, scan %q; want [- - 3] and [3]", point, scanned)
	}
	// And once committed, from Pebble alone.
	if err := e.update(ctx, func(t *txn) error {
		scanned = scanned[:0]
		return t.scan(p, func(_, v []byte) error { scanned = append(scanned, string(v)); return nil })
	}); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(scanned, []string{"3"}) {
		t.Fatalf("after the group: scan %q, want [3]", scanned)
	}
}
