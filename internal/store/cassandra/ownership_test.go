package cassandra

import (
	"slices"
	"testing"

	"quill/internal/store"
)

// FuzzDecodeMembers: a stored cluster map decodes to a valid map or to an
// error, never a partial one, and a valid map survives encoding.
func FuzzDecodeMembers(f *testing.F) {
	f.Add(int64(1), []byte(`[{"id":"a","w":100}]`))
	f.Add(int64(7), []byte(`[{"id":"a","w":100},{"id":"b","w":0,"d":true}]`))
	f.Add(int64(0), []byte(`[]`))
	f.Add(int64(2), []byte(`[{"id":"a"},{"id":"a"}]`))
	f.Add(int64(3), []byte(`{"id":"a"}`))
	f.Fuzz(func(t *testing.T, epoch int64, b []byte) {
		m, err := decodeMembers(epoch, b)
		if err != nil {
			return
		}
		if store.CheckClusterMap(m) != nil {
			t.Fatalf("decoded an invalid map %+v", m)
		}
		enc, err := encodeMembers(m.Members)
		if err != nil {
			t.Fatal(err)
		}
		again, err := decodeMembers(epoch, enc)
		if err != nil || !slices.Equal(again.Members, m.Members) {
			t.Fatalf("round trip of %+v = %+v, %v", m, again, err)
		}
	})
}
