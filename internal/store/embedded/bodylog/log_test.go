package bodylog

import (
	"errors"
	"fmt"
	"strings"
	"syscall"
	"testing"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"
)

// record is what one commit of writeRecords wrote: the record's position,
// the body's place, and the key its batch set.
type record struct {
	pos  Pos
	seg  uint32
	off  int64
	body string
	key  []byte
}

func openDB(t *testing.T, fs vfs.FS, dir string) *pebble.DB {
	t.Helper()
	db, err := pebble.Open(dir, &pebble.Options{FS: fs, DisableWAL: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

// writeRecords commits n records to l, each with one body and a batch
// setting one key, as the engine's committer does.
func writeRecords(t *testing.T, l *Log, db *pebble.DB, n int) []record {
	t.Helper()
	var out []record
	for i := range n {
		pos, err := l.Begin()
		if err != nil {
			t.Fatal(err)
		}
		body := fmt.Sprintf("body %d %s", i, strings.Repeat("x", 300))
		seg, off := l.AddBody([]byte(body))
		key := fmt.Appendf(nil, "k%04d", i)
		b := db.NewBatch()
		b.Set(key, Pos{seg, off}.Encode(), nil)
		err = l.Commit(b.Repr())
		b.Close()
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, record{pos, seg, off, body, key})
	}
	return out
}

// applied returns which of recs' keys db holds.
func applied(t *testing.T, db *pebble.DB, recs []record) []bool {
	t.Helper()
	out := make([]bool, len(recs))
	for i, r := range recs {
		v, closer, err := db.Get(r.key)
		if errors.Is(err, pebble.ErrNotFound) {
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		p, err := DecodePos(v)
		closer.Close()
		if err != nil || p != (Pos{r.seg, r.off}) {
			t.Fatalf("%s = %v, %v; want %v", r.key, p, err, Pos{r.seg, r.off})
		}
		out[i] = true
	}
	return out
}

// TestReplay: records written across several segments are readable where
// AddBody put them, and a replay applies exactly the batches after the
// position it is given. Garbage after the last record is a torn tail, and
// the replays after the first find that segment's end in the header of the
// segment the first one started.
func TestReplay(t *testing.T) {
	fs := vfs.NewMem()
	l, err := Open(fs, "/log", 4<<10)
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Replay(openDB(t, fs, "/scratch"), Pos{}); err != nil {
		t.Fatal(err)
	}
	recs := writeRecords(t, l, openDB(t, fs, "/unused"), 40)
	if n := len(l.Segments()); n < 3 {
		t.Fatalf("%d segments, want several", n)
	}
	for _, r := range recs {
		s, ok := l.Acquire(r.seg)
		if !ok {
			t.Fatalf("segment %d not listed", r.seg)
		}
		b := make([]byte, len(r.body))
		n, err := s.ReadAt(b, r.off)
		l.Release(s)
		if n != len(b) || string(b) != r.body {
			t.Fatalf("body at %d/%d: %q, %v", r.seg, r.off, b[:n], err)
		}
	}
	l.Close()

	// A torn write after the last record.
	segs, _ := fs.List("/log")
	last := "/log/" + SegName(recs[len(recs)-1].seg)
	f, err := fs.OpenReadWrite(last, vfs.WriteCategoryUnspecified)
	if err != nil {
		t.Fatal(err)
	}
	st, _ := f.Stat()
	f.WriteAt([]byte("\x00\x10\x00\x00noise"), st.Size())
	f.Close()

	for _, from := range []int{-1, 0, 17, len(recs) - 1} {
		var pos Pos
		if from >= 0 {
			pos = recs[from].pos
		}
		l, err := Open(fs, "/log", 4<<10)
		if err != nil {
			t.Fatal(err)
		}
		db := openDB(t, fs, fmt.Sprintf("/db%d", from))
		if err := l.Replay(db, pos); err != nil {
			t.Fatalf("replaying from record %d: %v (segments %v)", from, err, segs)
		}
		for i, ok := range applied(t, db, recs) {
			if ok != (i > from) {
				t.Fatalf("replaying from record %d: record %d applied %v", from, i, ok)
			}
		}
		l.Close()
	}
}

// TestRecoverTail: a log that failed for lack of space refuses records
// until RecoverTail resumes it in a new segment; any other failure is
// final.
func TestRecoverTail(t *testing.T) {
	fs := vfs.NewMem()
	l, err := Open(fs, "/log", 64<<10)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	scratch := openDB(t, fs, "/scratch")
	if err := l.Replay(scratch, Pos{}); err != nil {
		t.Fatal(err)
	}
	before := writeRecords(t, l, scratch, 3)
	l.Fail(fmt.Errorf("writing: %w", syscall.ENOSPC))
	if _, err := l.Begin(); !IsNoSpace(err) {
		t.Fatalf("Begin after ENOSPC: %v", err)
	}
	if err := l.RecoverTail(); err != nil {
		t.Fatal(err)
	}
	after := writeRecords(t, l, scratch, 3)
	if after[0].seg != before[0].seg+1 || l.Stats().Resumed != 1 {
		t.Fatalf("resumed in segment %d after %d, %d times", after[0].seg, before[0].seg, l.Stats().Resumed)
	}
	l.Fail(syscall.EIO)
	if err := l.RecoverTail(); !errors.Is(err, syscall.EIO) {
		t.Fatalf("RecoverTail after EIO: %v", err)
	}
	if err, noSpace := l.Failure(); !errors.Is(err, syscall.EIO) || noSpace {
		t.Fatalf("Failure = %v, %v", err, noSpace)
	}
}

func TestPos(t *testing.T) {
	p := Pos{Seg: 7, Off: 1 << 40}
	if got, err := DecodePos(p.Encode()); err != nil || got != p {
		t.Fatalf("DecodePos(Encode(%v)) = %v, %v", p, got, err)
	}
	if _, err := DecodePos([]byte{1, 2, 3}); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("DecodePos of 3 bytes: %v", err)
	}
}
