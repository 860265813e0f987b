package embedded

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"maps"
	"slices"
	"strings"
	"testing"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"

	"quill/internal/store"
	"quill/internal/store/embedded/bodylog"
)

// deliverN appends n messages of about size bytes to a new user's INBOX,
// inline as delivery does, and returns the mailbox and the bodies by UID.
func deliverN(t *testing.T, e *Engine, user string, n, size int) (store.ID, map[uint32]string) {
	t.Helper()
	ctx := context.Background()
	if err := e.CreateUser(ctx, store.User{Address: user}); err != nil {
		t.Fatal(err)
	}
	m, err := e.GetMailbox(ctx, user, "INBOX")
	if err != nil {
		t.Fatal(err)
	}
	bodies := map[uint32]string{}
	for i := range n {
		body := fmt.Sprintf("message %d\r\n%s\r\n", i, strings.Repeat(string(rune('a'+i%26)), size))
		msgs, err := writer(e).Append(ctx, m.ID, []store.NewMessage{{Body: []byte(body), Size: int64(len(body))}}, store.AppendOptions{})
		if err != nil {
			t.Fatal(err)
		}
		bodies[msgs[0].UID] = body
	}
	return m.ID, bodies
}

// expungeUnless expunges the messages whose UID keep rejects and drops them
// from bodies.
func expungeUnless(t *testing.T, e *Engine, box store.ID, bodies map[uint32]string, keep func(uid uint32) bool) {
	t.Helper()
	var gone []uint32
	for uid := range bodies {
		if !keep(uid) {
			gone = append(gone, uid)
		}
	}
	if _, _, err := writer(e).Expunge(context.Background(), box, gone); err != nil {
		t.Fatal(err)
	}
	for _, uid := range gone {
		delete(bodies, uid)
	}
}

// verifyBodies checks that the mailbox holds exactly the given bodies, and
// that the store is consistent.
func verifyBodies(t *testing.T, e *Engine, box store.ID, bodies map[uint32]string) {
	t.Helper()
	ctx := context.Background()
	msgs, err := e.ListMessages(ctx, box, 1, 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	if len(msgs) != len(bodies) {
		t.Fatalf("%d messages, want %d", len(msgs), len(bodies))
	}
	for _, m := range msgs {
		r, err := e.OpenBlob(ctx, m.Blob)
		if err != nil {
			t.Fatalf("uid %d: %v", m.UID, err)
		}
		b, err := io.ReadAll(r)
		r.Close()
		if err != nil || string(b) != bodies[m.UID] {
			t.Fatalf("uid %d: body differs (%d bytes, %v)", m.UID, len(b), err)
		}
	}
	if problems, err := e.Check(ctx); err != nil || len(problems) > 0 {
		t.Fatalf("Check: %v %v", problems, err)
	}
}

// reopenVerified checks the bodies, closes e, reopens the store and checks
// them again. The test's cleanup closes the engine it returns.
func reopenVerified(t *testing.T, e *Engine, dir string, opts Options, box store.ID, bodies map[uint32]string) *Engine {
	t.Helper()
	verifyBodies(t, e, box, bodies)
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	e, err := Open(dir, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	verifyBodies(t, e, box, bodies)
	return e
}

// TestLogCleaning: once most messages are expunged, a cleaning pass copies
// survivors forward and deletes sparse segments until the log is within its
// space budget (cleanPlan); a reader that
// opened a body before it moved keeps reading it; and all of it holds
// across a reopen.
func TestLogCleaning(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	opts := Options{LogSegmentBytes: 64 << 10}
	e, err := Open(dir, opts)
	if err != nil {
		t.Fatal(err)
	}
	box, bodies := deliverN(t, e, "u@example.test", 300, 4000)
	before := e.blog.Stats()
	expungeUnless(t, e, box, bodies, func(uid uint32) bool { return uid%4 == 0 })
	var keptBytes int64
	for _, b := range bodies {
		keptBytes += int64(len(b))
	}
	// A reader opened before the cleaning.
	first, err := e.GetMessage(ctx, box, 4)
	if err != nil {
		t.Fatal(err)
	}
	r, err := e.OpenBlob(ctx, first.Blob)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()

	if err := e.cleanLog(true); err != nil {
		t.Fatal(err)
	}
	after := e.blog.Stats()
	t.Logf("before: %d segments, %d bytes; after: %d segments, %d bytes, %d live, %d deleted, %d moved",
		before.Segments, before.Size, after.Segments, after.Size, after.Live, after.Removed, after.Moved)
	if after.Live != keptBytes {
		t.Errorf("live bytes %d, want the kept bodies' %d", after.Live, keptBytes)
	}
	if after.Removed == 0 || after.Moved == 0 {
		t.Errorf("cleaning deleted %d segments and moved %d bytes; want both", after.Removed, after.Moved)
	}
	// Within the budget, give or take the current segment, which the
	// moves filled.
	if max := cleanBudget*after.Live + 2*opts.LogSegmentBytes; after.Size > max {
		t.Errorf("log is %d bytes after cleaning, want at most %d", after.Size, max)
	}
	if after.Size >= before.Size/2 {
		t.Errorf("log is %d bytes after cleaning, was %d", after.Size, before.Size)
	}
	got, err := io.ReadAll(r)
	if err != nil || string(got) != bodies[4] {
		t.Fatalf("reader opened before the move: %d bytes, %v", len(got), err)
	}
	e = reopenVerified(t, e, dir, opts, box, bodies)
	if st := e.blog.Stats(); st.Live != keptBytes {
		t.Errorf("after reopening, live bytes %d, want %d", st.Live, keptBytes)
	}
}

// TestLogCleaningInBatches: a segment whose live bodies exceed one
// cleaning transaction's bound is moved in several, which share one read
// buffer; every body must arrive intact.
func TestLogCleaningInBatches(t *testing.T) {
	dir := t.TempDir()
	opts := Options{LogSegmentBytes: 2 << 20}
	e, err := Open(dir, opts)
	if err != nil {
		t.Fatal(err)
	}
	box, bodies := deliverN(t, e, "u@example.test", 1500, 4000)
	// 30% live: over budget, and over moveBatchBytes in each sealed
	// segment.
	expungeUnless(t, e, box, bodies, func(uid uint32) bool { return uid%10 < 3 })
	if err := e.cleanLog(true); err != nil {
		t.Fatal(err)
	}
	st := e.blog.Stats()
	if st.Moved <= moveBatchBytes {
		t.Errorf("moved %d bytes; want more than one batch's %d", st.Moved, moveBatchBytes)
	}
	reopenVerified(t, e, dir, opts, box, bodies)
}

// TestLogReuse: the files of deleted segments become later segments; what
// they held before, records or header, is never taken for the new
// segment's, whether the store closed or lost power; and a spare renamed
// to a segment whose header was never written is a torn header.
func TestLogReuse(t *testing.T) {
	ctx := context.Background()
	fs := vfs.NewCrashableMem()
	opts := Options{FS: fs, LogSegmentBytes: 64 << 10}
	e, err := Open("/quill", opts)
	if err != nil {
		t.Fatal(err)
	}
	box, bodies := deliverN(t, e, "u@example.test", 300, 4000)
	expungeUnless(t, e, box, bodies, func(uid uint32) bool { return uid%4 == 0 })
	if err := e.cleanLog(true); err != nil {
		t.Fatal(err)
	}
	spares := spareFiles(t, fs)
	if len(spares) != bodylog.SpareSegments {
		t.Fatalf("spare files %v after deleting %d segments, want %d", spares, e.blog.Stats().Removed, bodylog.SpareSegments)
	}
	appendOne := func(i int) {
		body := fmt.Sprintf("after the cleaning %d\r\n%s\r\n", i, strings.Repeat("z", 4000))
		msgs, err := writer(e).Append(ctx, box, []store.NewMessage{{Body: []byte(body), Size: int64(len(body))}}, store.AppendOptions{})
		if err != nil {
			t.Fatal(err)
		}
		bodies[msgs[0].UID] = body
	}
	spareCount := func() int { return e.blog.Stats().Spares }
	// Mail until the log moves into a spare, and a little more.
	i := 0
	for ; spareCount() == bodylog.SpareSegments; i++ {
		if i > 100 {
			t.Fatal("the log never moved into a spare file")
		}
		appendOne(i)
	}
	for range 3 {
		appendOne(i)
		i++
	}
	// The current segment is a reused file longer than what was written
	// to it, so a recovery reads the old records after the new ones.
	listed := e.blog.Segments()
	cur := listed[len(listed)-1] // the newest
	st, err := fs.Stat("/quill/log/" + bodylog.SegName(cur.ID))
	if err != nil {
		t.Fatal(err)
	}
	if st.Size() <= cur.Size {
		t.Fatalf("current segment: file of %d bytes, %d written; want a reused, longer file", st.Size(), cur.Size)
	}
	crashed := fs.CrashClone(vfs.CrashCloneCfg{UnsyncedDataPercent: 0})
	crashedBodies := maps.Clone(bodies)
	// Then enough to use every spare.
	for range 16 * bodylog.SpareSegments {
		appendOne(i)
		i++
	}
	for _, name := range spareFiles(t, fs) {
		if slices.Contains(spares, name) {
			t.Fatalf("spare %s was not reused (spares before: %v)", name, spares)
		}
	}
	verifyBodies(t, e, box, bodies)
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	e, err = Open("/quill", Options{FS: crashed, LogSegmentBytes: opts.LogSegmentBytes})
	if err != nil {
		t.Fatalf("recovering from a power loss in a reused segment: %v", err)
	}
	verifyBodies(t, e, box, crashedBodies)
	e.Close()
	e, err = Open("/quill", opts)
	if err != nil {
		t.Fatalf("reopening: %v", err)
	}
	verifyBodies(t, e, box, bodies)

	// A crash between a spare's rename and its header's sync leaves the
	// next segment with the file's old header; a second crash, in the
	// rotation of the recovery that followed, leaves another after it.
	expungeUnless(t, e, box, bodies, func(uid uint32) bool { return uid%8 == 0 })
	if err := e.cleanLog(true); err != nil {
		t.Fatal(err)
	}
	e.Close()
	// The segments deleted were read at open, not written since: they
	// are kept as spares all the same.
	spares = spareFiles(t, fs)
	segs := logSegments(t, fs)
	if len(spares) != bodylog.SpareSegments {
		t.Fatalf("spare files %v after cleaning a reopened log, want %d", spares, bodylog.SpareSegments)
	}
	var last uint32
	fmt.Sscanf(segs[len(segs)-1], "%d.log", &last)
	for i := range 2 {
		if err := fs.Rename("/quill/log/"+spares[i], "/quill/log/"+bodylog.SegName(last+1+uint32(i))); err != nil {
			t.Fatal(err)
		}
	}
	e, err = Open("/quill", opts)
	if err != nil {
		t.Fatalf("opening with two spares renamed but not rewritten: %v", err)
	}
	defer e.Close()
	verifyBodies(t, e, box, bodies)
}

func spareFiles(t *testing.T, fs vfs.FS) []string {
	t.Helper()
	var spares []string
	for _, name := range logSegments(t, fs) {
		if strings.HasSuffix(name, ".free") {
			spares = append(spares, name)
		}
	}
	return spares
}

// crashedLog delivers into a crashable filesystem without closing the
// store, so that the log, not Pebble's tables, holds the deliveries, and
// returns the filesystem as a power loss would leave it.
func crashedLog(t *testing.T, n int) (*vfs.MemFS, store.ID, map[uint32]string) {
	t.Helper()
	fs := vfs.NewCrashableMem()
	e, err := Open("/quill", Options{FS: fs, LogSegmentBytes: 32 << 10})
	if err != nil {
		t.Fatal(err)
	}
	box, bodies := deliverN(t, e, "u@example.test", n, 3000)
	crashed := fs.CrashClone(vfs.CrashCloneCfg{UnsyncedDataPercent: 0})
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	return crashed, box, bodies
}

func logSegments(t *testing.T, fs vfs.FS) []string {
	t.Helper()
	names, err := fs.List("/quill/log")
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(names)
	return names
}

// TestLogTornTail: garbage after the last record (a write the crash cut
// short) is dropped at recovery, writing resumes in a new segment, and a
// second recovery still reads everything.
func TestLogTornTail(t *testing.T) {
	fs, box, bodies := crashedLog(t, 60)
	segs := logSegments(t, fs)
	last := "/quill/log/" + segs[len(segs)-1]
	f, err := fs.OpenReadWrite(last, vfs.WriteCategoryUnspecified)
	if err != nil {
		t.Fatal(err)
	}
	st, _ := f.Stat()
	// A record header promising more than follows, then noise.
	if _, err := f.WriteAt([]byte("\x00\x10\x00\x00\xde\xad\xbe\xefnoise"), st.Size()); err != nil {
		t.Fatal(err)
	}
	f.Sync()
	f.Close()

	e, err := Open("/quill", Options{FS: fs, LogSegmentBytes: 32 << 10})
	if err != nil {
		t.Fatalf("recovering past a torn tail: %v", err)
	}
	verifyBodies(t, e, box, bodies)
	// More mail after the recovery, then a second power loss.
	crashAfterAppend(t, e, fs, box, bodies, "after the first recovery\r\n")
}

// crashAfterAppend appends body to box in e (open on fs), loses power,
// closes e, and recovers the crashed copy, which must hold bodies and the
// new one.
func crashAfterAppend(t *testing.T, e *Engine, fs *vfs.MemFS, box store.ID, bodies map[uint32]string, body string) {
	t.Helper()
	msgs, err := writer(e).Append(context.Background(), box, []store.NewMessage{{Body: []byte(body), Size: int64(len(body))}}, store.AppendOptions{})
	if err != nil {
		t.Fatal(err)
	}
	bodies[msgs[0].UID] = body
	crashed := fs.CrashClone(vfs.CrashCloneCfg{UnsyncedDataPercent: 0})
	e.Close()
	e, err = Open("/quill", Options{FS: crashed})
	if err != nil {
		t.Fatalf("recovering after appending %q: %v", body, err)
	}
	defer e.Close()
	verifyBodies(t, e, box, bodies)
}

// TestLogCorruptionRefused: damage before the log's end, or to the header
// of a segment that holds records (even the last), is not a torn write, and
// the store refuses to open rather than lose the records it covers.
func TestLogCorruptionRefused(t *testing.T) {
	for _, c := range []struct {
		name string
		seg  func(segs []string) string
		at   int64
	}{
		// In the first record's bodies: past the segment's header and the
		// record's length, checksum and bodies' length.
		{"record in an earlier segment", func(segs []string) string { return segs[1] }, bodylog.HeaderLen + 12 + 100},
		{"header of an earlier segment", func(segs []string) string { return segs[1] }, 0},
		{"header of the last segment", func(segs []string) string { return segs[len(segs)-1] }, 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			fs, _, _ := crashedLog(t, 60)
			segs := logSegments(t, fs)
			if len(segs) < 3 {
				t.Fatalf("want several segments, have %v", segs)
			}
			f, err := fs.OpenReadWrite("/quill/log/"+c.seg(segs), vfs.WriteCategoryUnspecified)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := f.WriteAt([]byte("XXXX"), c.at); err != nil {
				t.Fatal(err)
			}
			f.Sync()
			f.Close()
			e, err := Open("/quill", Options{FS: fs})
			if err == nil {
				e.Close()
				t.Fatal("opened a store whose log is corrupt")
			}
			if !errors.Is(err, errCorrupt) {
				t.Fatalf("error %v, want errCorrupt", err)
			}
			t.Log(err)
		})
	}
}

// TestUpgradeFromChunkStore: a store at schema level 1 (bodies in chunks
// only) opens, is raised to level 2, and keeps its bodies readable.
func TestUpgradeFromChunkStore(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	e, err := Open(dir, Options{})
	if err != nil {
		t.Fatal(err)
	}
	box, bodies := deliverN(t, e, "u@example.test", 3, 100)
	// A body in chunks, as level 1 stored every body.
	big := strings.Repeat("chunked\r\n", 40000)
	id, n, err := e.PutBlob(ctx, strings.NewReader(big), 0)
	if err != nil {
		t.Fatal(err)
	}
	msgs, err := writer(e).Append(ctx, box, []store.NewMessage{{Blob: id, Size: n}}, store.AppendOptions{})
	if err != nil {
		t.Fatal(err)
	}
	bodies[msgs[0].UID] = big
	e = reopenUpgraded(t, e, dir, 1, nil)
	defer e.Close()
	verifyBodies(t, e, box, bodies)
}

// reopenUpgraded sets e's schema level to level, with whatever else write
// puts in the same transaction, closes it and reopens the store, which
// must come back at this binary's level.
func reopenUpgraded(t *testing.T, e *Engine, dir string, level byte, write func(*txn) error) *Engine {
	t.Helper()
	if err := e.update(context.Background(), func(t *txn) error {
		if write != nil {
			if err := write(t); err != nil {
				return err
			}
		}
		t.set([]byte{tVersion}, []byte{level})
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	e.Close()
	e, err := Open(dir, Options{})
	if err != nil {
		t.Fatalf("opening a level-%d store: %v", level, err)
	}
	if v, err := e.get(e.db, []byte{tVersion}); err != nil || v[0] != schemaLevel {
		e.Close()
		t.Fatalf("schema level %v, %v; want %d", v, err, schemaLevel)
	}
	return e
}

// TestUpgradeFromLogIndex: a store at schema level 2, which kept a log
// index entry per body in Pebble, opens at level 3 with those segments
// frozen; expunges delete their entries, and a reopen finds them again.
func TestUpgradeFromLogIndex(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	e, err := Open(dir, Options{})
	if err != nil {
		t.Fatal(err)
	}
	box, bodies := deliverN(t, e, "u@example.test", 20, 300)
	// Level 2's index: 'g' segment(4) blobID -> size, one per body.
	msgs, err := e.ListMessages(ctx, box, 1, 1<<20)
	if err != nil || len(msgs) != len(bodies) {
		t.Fatalf("listed %d messages, %v; want %d", len(msgs), err, len(bodies))
	}
	e = reopenUpgraded(t, e, dir, 2, func(t *txn) error {
		for _, m := range msgs {
			r, err := t.blob(m.Blob)
			if err != nil {
				return err
			}
			t.set(loggedKey(r.Seg, m.Blob), binary.AppendVarint(nil, r.Size))
		}
		return nil
	})
	r, err := e.committedBlob(msgs[0].Blob)
	if err != nil {
		t.Fatal(err)
	}
	s, ok := e.blog.Acquire(r.Seg)
	if !ok {
		t.Fatalf("segment %d is not listed", r.Seg)
	}
	ids, frozen := e.blog.YoungBlobs(s)
	e.blog.Release(s)
	if !frozen || len(ids) > 0 {
		t.Fatalf("segment %d: frozen %v, %d blobs in memory; want frozen, none", r.Seg, frozen, len(ids))
	}
	expungeUnless(t, e, box, bodies, func(uid uint32) bool { return uid%2 == 0 })
	var live int64
	for _, b := range bodies {
		live += int64(len(b))
	}
	if st := e.blog.Stats(); st.Live != live {
		t.Errorf("live bytes %d, want the kept bodies' %d", st.Live, live)
	}
	e = reopenVerified(t, e, dir, Options{}, box, bodies) // Check included
	if st := e.blog.Stats(); st.Live != live {
		t.Errorf("after reopening, live bytes %d, want %d", st.Live, live)
	}
}

// TestLogIndexFreeze: the oldest segments' log indexes move from memory
// into Pebble once the young ones list more than LogIndexBlobs blobs,
// holding only the blobs still in them; expunges and the cleaner's moves
// delete their entries; a reopen finds which segments are frozen; and
// Check notices an index that misses a blob, in memory or in Pebble,
// before the cleaner could delete its body.
func TestLogIndexFreeze(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	opts := Options{LogSegmentBytes: 64 << 10, LogIndexBlobs: 20}
	e, err := Open(dir, opts)
	if err != nil {
		t.Fatal(err)
	}
	box, bodies := deliverN(t, e, "u@example.test", 300, 4000)
	expungeUnless(t, e, box, bodies, func(uid uint32) bool { return uid%3 == 0 })
	if err := e.cleanLog(false); err != nil {
		t.Fatal(err)
	}
	frozenSegs := func(e *Engine) (n int) {
		for _, s := range e.blog.Segments() {
			if s.Frozen {
				n++
				if s.Blobs > 0 {
					t.Errorf("frozen segment %d holds %d blobs in memory", s.ID, s.Blobs)
				}
			}
		}
		return n
	}
	entries := func(e *Engine) (n int) {
		it, err := e.db.NewIter(&pebble.IterOptions{LowerBound: []byte{tLogged}, UpperBound: []byte{tLogged + 1}})
		if err != nil {
			t.Fatal(err)
		}
		defer it.Close()
		for ok := it.First(); ok; ok = it.Next() {
			n++
		}
		return n
	}
	before := frozenSegs(e)
	if before == 0 {
		t.Fatal("no segment frozen")
	}
	if err := e.checkpoint("test"); err != nil {
		t.Fatal(err)
	}
	if n := entries(e); n == 0 || n > len(bodies) {
		t.Errorf("%d log index entries in Pebble for %d live bodies; want some, at most one each", n, len(bodies))
	}
	verifyBodies(t, e, box, bodies) // Check included
	// Moves out of frozen segments, and expunges of their blobs.
	if err := e.cleanLog(true); err != nil {
		t.Fatal(err)
	}
	expungeUnless(t, e, box, bodies, func(uid uint32) bool { return uid%6 == 0 })
	e = reopenVerified(t, e, dir, opts, box, bodies)
	if frozenSegs(e) == 0 {
		t.Error("no segment frozen after reopening")
	}

	// The cleaner deletes a segment whose index lists no blob: Check
	// reports a blob missing from its segment's index.
	msgs, err := e.ListMessages(ctx, box, 1, 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	var young, old *store.Message
	for i := range msgs {
		r, err := e.committedBlob(msgs[i].Blob)
		if err != nil {
			t.Fatal(err)
		}
		if e.blog.IsFrozen(r.Seg) {
			old = &msgs[i]
		} else {
			young = &msgs[i]
		}
	}
	if young == nil || old == nil {
		t.Fatalf("want blobs in young and frozen segments (young %v, frozen %v)", young != nil, old != nil)
	}
	r, _ := e.committedBlob(young.Blob)
	// Out of its segment's index, its live bytes left as they are.
	e.blog.AddLive([]bodylog.Delta{{Seg: r.Seg, Blob: young.Blob}})
	problems, err := e.Check(ctx)
	if err != nil || len(problems) != 1 || !strings.Contains(problems[0], "does not list it") {
		t.Fatalf("Check with a blob missing from a young segment's index: %q, %v", problems, err)
	}
	e.blog.AddLive([]bodylog.Delta{{Seg: r.Seg, Blob: young.Blob, Add: true}})
	r, _ = e.committedBlob(old.Blob)
	if err := e.update(ctx, func(t *txn) error { t.del(loggedKey(r.Seg, old.Blob)); return nil }); err != nil {
		t.Fatal(err)
	}
	problems, err = e.Check(ctx)
	if err != nil || len(problems) != 1 || !strings.Contains(problems[0], "does not list it") {
		t.Fatalf("Check with a blob missing from a frozen segment's index: %q, %v", problems, err)
	}
}

// TestLogReadsV1Segments: segments written before the checksums covered
// the segment number ("QLG1") still recover, and the log goes on after them
// in the current format (package bodylog's comment gives both).
func TestLogReadsV1Segments(t *testing.T) {
	crcTable := crc32.MakeTable(crc32.Castagnoli)
	logSeed := func(id uint32) uint32 { return crc32.Checksum(binary.LittleEndian.AppendUint32(nil, id), crcTable) }
	fs, box, bodies := crashedLog(t, 60)
	for _, name := range logSegments(t, fs) {
		var id uint32
		fmt.Sscanf(name, "%d.log", &id)
		f, err := fs.OpenReadWrite("/quill/log/"+name, vfs.WriteCategoryUnspecified)
		if err != nil {
			t.Fatal(err)
		}
		st, _ := f.Stat()
		b := make([]byte, st.Size())
		if _, err := f.ReadAt(b, 0); err != nil {
			t.Fatal(err)
		}
		seed := logSeed(id)
		if string(b[:4]) != "QLG2" || crc32.Update(seed, crcTable, b[:12]) != binary.LittleEndian.Uint32(b[12:16]) {
			t.Fatalf("%s: not a current segment header", name)
		}
		copy(b, "QLG1")
		binary.LittleEndian.PutUint32(b[12:16], crc32.Checksum(b[:12], crcTable))
		for pos := bodylog.HeaderLen; pos+8 <= len(b); {
			n := int(binary.LittleEndian.Uint32(b[pos:]))
			if n < 4 || pos+8+n > len(b) || crc32.Update(seed, crcTable, b[pos+8:pos+8+n]) != binary.LittleEndian.Uint32(b[pos+4:]) {
				break
			}
			binary.LittleEndian.PutUint32(b[pos+4:], crc32.Checksum(b[pos+8:pos+8+n], crcTable))
			pos += 8 + n
		}
		if _, err := f.WriteAt(b, 0); err != nil {
			t.Fatal(err)
		}
		f.Sync()
		f.Close()
	}
	e, err := Open("/quill", Options{FS: fs})
	if err != nil {
		t.Fatalf("recovering from QLG1 segments: %v", err)
	}
	verifyBodies(t, e, box, bodies)
	// Recovery from QLG1 segments followed by a QLG2 one.
	crashAfterAppend(t, e, fs, box, bodies, "after the QLG1 segments\r\n")
}

// cleanPlan reclaims dead segments always, copies forward only while the
// log is over its budget, prefers old and empty segments, and never takes
// the current segment or one at least half live.
func TestCleanPlan(t *testing.T) {
	const seg = 100
	type s struct {
		id     uint32
		live   int64
		sealed bool
	}
	cases := []struct {
		name string
		segs []s
		want []uint32
	}{
		{"within budget: only the dead", []s{{1, 40, true}, {2, 0, true}, {3, 45, true}, {4, 50, false}}, []uint32{2}},
		// 5 segments of 100 with 110 live: budget 2*110+100 = 320; the
		// oldest first, until what they free brings the log under it.
		{"over budget: oldest sparse first", []s{{1, 30, true}, {2, 30, true}, {3, 20, true}, {4, 20, true}, {5, 10, false}}, []uint32{1, 2, 3}},
		{"half live or current: never", []s{{1, 50, true}, {2, 60, true}, {3, 5, false}}, nil},
		// Budget 2*176+100 = 452 of 500: one segment is enough.
		{"empty but young beats fuller but old", []s{{1, 45, true}, {2, 1, true}, {3, 45, true}, {4, 45, true}, {5, 40, false}}, []uint32{2}},
	}
	for _, c := range cases {
		var segs []bodylog.SegmentInfo
		for _, x := range c.segs {
			segs = append(segs, bodylog.SegmentInfo{ID: x.id, Size: seg, Live: x.live, Sealed: x.sealed})
		}
		var got []uint32
		for _, p := range cleanPlan(segs, seg) {
			got = append(got, p.ID)
		}
		if !slices.Equal(got, c.want) {
			t.Errorf("%s: plan %v, want %v", c.name, got, c.want)
		}
	}
}
