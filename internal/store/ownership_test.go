package store

import (
	"slices"
	"testing"
)

// FuzzDecodeMembers: stored map members decode to a valid map or to an
// error, never a partial one, and a valid map survives encoding.
func FuzzDecodeMembers(f *testing.F) {
	f.Add(uint64(1), []byte(`[{"id":"a","w":100}]`))
	f.Add(uint64(7), []byte(`[{"id":"a","w":100},{"id":"b","w":0,"d":true}]`))
	f.Add(uint64(0), []byte(`[]`))
	f.Add(uint64(2), []byte(`[{"id":"a"},{"id":"a"}]`))
	f.Add(uint64(3), []byte(`{"id":"a"}`))
	f.Add(uint64(1<<40), []byte(`[{"id":"a","w":1}]`))
	f.Fuzz(func(t *testing.T, epoch uint64, b []byte) {
		m, err := DecodeMembers(epoch, b)
		if err != nil {
			return
		}
		if CheckClusterMap(m) != nil {
			t.Fatalf("decoded an invalid map %+v", m)
		}
		enc, err := EncodeMembers(m.Members)
		if err != nil {
			t.Fatal(err)
		}
		again, err := DecodeMembers(epoch, enc)
		if err != nil || !slices.Equal(again.Members, m.Members) {
			t.Fatalf("round trip of %+v = %+v, %v", m, again, err)
		}
	})
}
