package overlay

import (
	"errors"
	"fmt"
	"slices"
	"testing"
)

// A layer copies what it holds into its arena, and a value a reader got
// from it stays as it was after the layer is checkpointed, reset and
// filled again (the arena's chunks are never reused); the writer's own
// slices may change once merged.
func TestOverlayValuesOutliveTheirLayer(t *testing.T) {
	o := New(&Schema{})
	key, val := []byte("x-key"), []byte("first value")
	o.Merge([]Write{{Key: key, Value: val}})
	copy(val, "XXXXXXXXXXX") // the transaction's buffer, reused
	got, ok := o.Lookup([]byte("x-key"))
	if !ok || string(got) != "first value" {
		t.Fatalf("lookup = %q %v, want the merged value", got, ok)
	}
	big := make([]byte, arenaValueMax+1)
	for round := range 3 {
		o.cur.reset()
		for i := range 2 * arenaChunk / 64 {
			k := fmt.Appendf(nil, "k-%d-%d", round, i)
			o.Merge([]Write{{Key: k, Value: make([]byte, 48)}, {Key: []byte("big"), Value: big}})
		}
	}
	if string(got) != "first value" {
		t.Errorf("a value read from the overlay changed to %q after its layer was reused", got)
	}
	if v, ok := o.Lookup([]byte("big")); !ok || len(v) != len(big) || &v[0] != &big[0] {
		t.Errorf("a value over arenaValueMax is copied (or lost): %d bytes, %v", len(v), ok)
	}
}

// testSchema: 'x' and 'm' keys share a span of a 2-byte id, 'n' keys are
// per user, 'q' keys are untracked, the rest other.
func testSchema() *Schema {
	s := new(Schema)
	s.Spans('m', 2, 'x', 'm')
	s.ByUser('n')
	s.Untracked('q')
	return s
}

// Touches answers for a prefix from the writes that an iteration of it
// could see: its span's, its user's, or any other table's.
func TestTouches(t *testing.T) {
	o := New(testSchema())
	o.Merge([]Write{{Key: []byte("xAB1"), Value: []byte("v")}, {Key: []byte("nbob\x00INBOX"), Value: []byte("v")},
		{Key: []byte("quser"), Value: []byte("v")}})
	for _, c := range []struct {
		prefix string
		want   bool
	}{
		{"xAB", true}, {"mAB", true}, {"xAC", false},
		{"nbob\x00", true}, {"nalice\x00", false},
		{"x", false}, {"u", false}, {"q", false}, // no other table written
	} {
		if got := o.Touches([]byte(c.prefix)); got != c.want {
			t.Errorf("Touches(%q) = %v, want %v", c.prefix, got, c.want)
		}
	}
	o.Merge([]Write{{Key: []byte("uuser"), Value: []byte("v")}})
	if !o.Touches([]byte("u")) || !o.Touches([]byte("q")) || o.Touches([]byte("xAC")) {
		t.Error("after an other table's write: Touches of other prefixes false, or of another span true")
	}
	// A fresh key's write and deletion cancel: nothing left to see.
	p := New(testSchema())
	p.Merge([]Write{{Key: []byte("xAB1"), Value: []byte("v"), Fresh: true}, {Key: []byte("xAB1"), Del: true}})
	if p.Touches([]byte("xAB")) {
		t.Error("Touches sees a cancelled write")
	}
}

// While a checkpoint applies one layer, Snapshot merges it with the newer
// one, newest write first, and Lookup finds both; a failed checkpoint
// keeps its writes and stops the overlay.
func TestCheckpointLayers(t *testing.T) {
	o := New(testSchema())
	o.Merge([]Write{{Key: []byte("xAB1"), Value: []byte("old")}, {Key: []byte("xAB2"), Value: []byte("2")},
		{Key: []byte("xAB3"), Value: []byte("3"), Fresh: true}})
	show := func(ws []Write) (out []string) {
		for _, w := range ws {
			out = append(out, fmt.Sprintf("%s=%s/%v", w.Key, w.Value, w.Del))
		}
		return out
	}
	failed := errors.New("no room")
	err := o.Checkpoint(func(l *Layer) error {
		if l.Live() != 3 || len(l.Writes()) != 3 {
			t.Errorf("applying %d writes, %d live; want 3", len(l.Writes()), l.Live())
		}
		o.Merge([]Write{{Key: []byte("xAB1"), Value: []byte("new")}, {Key: []byte("xAB0"), Value: []byte("0")},
			{Key: []byte("xAB3"), Del: true}})
		opened := false
		ws, v, found := o.Snapshot(MakeSpan('m', []byte("AB")), []byte("xAB"), []byte("xAB3"), []byte("mAB"), func() { opened = true })
		want := []string{"xAB0=0/false", "xAB1=new/false", "xAB2=2/false"}
		if got := show(ws); !opened || found || v != nil || !slices.Equal(got, want) {
			t.Errorf("Snapshot = %q, %q, %v (opened %v); want %q", got, v, found, opened, want)
		}
		if v, ok := o.Lookup([]byte("xAB2")); !ok || string(v) != "2" {
			t.Errorf("Lookup of the applying layer's write = %q, %v", v, ok)
		}
		return failed
	})
	if !errors.Is(err, failed) || !errors.Is(o.Err(), failed) || !errors.Is(o.Checkpoint(func(*Layer) error { return nil }), failed) {
		t.Fatalf("after a failed checkpoint: %v, Err %v", err, o.Err())
	}
	if v, ok := o.Lookup([]byte("xAB2")); !ok || string(v) != "2" {
		t.Errorf("Lookup after a failed checkpoint = %q, %v; want its write kept", v, ok)
	}
}
