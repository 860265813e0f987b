package embedded

import (
	"reflect"
	"testing"
	"time"

	"quill/internal/store"
)

// FuzzDecodeRecords feeds arbitrary bytes to every record decoder: a
// record that does not parse is errCorrupt, never a panic or an
// allocation beyond its length, and one that parses encodes back to a
// record that decodes to the same value.
func FuzzDecodeRecords(f *testing.F) {
	f.Add(encodeUser(store.User{Address: "a@example.test", PasswordHash: "h", QuotaBytes: 5, Created: time.Unix(1, 2)}))
	f.Add(encodeMailbox(store.Mailbox{ID: store.NewID(), User: "a", Name: "INBOX", UIDNext: 3, HighestModSeq: 9, ExpungeFloor: 4}))
	f.Add(encodeMessage(store.Message{ModSeq: 7, Size: 10, Blob: store.NewID(), Flags: []string{`\Seen`, "x"}, Meta: []byte{1, 2}}))
	f.Add(encodeBlob(blobRecord{Size: 10, Refs: 2, Seg: 3, Off: 40}))
	f.Add(encodeUsage(store.Usage{Bytes: 10, Messages: 1}))
	f.Fuzz(func(t *testing.T, b []byte) {
		roundTrip(t, "user", b, decodeUser, encodeUser)
		roundTrip(t, "mailbox", b, decodeMailbox, encodeMailbox)
		roundTrip(t, "message", b, func(b []byte) (store.Message, error) { return decodeMessage(7, b) }, encodeMessage)
		roundTrip(t, "blob", b, func(b []byte) (blobRecord, error) {
			r, err := decodeBlob(b)
			if r.Seg == 0 {
				r.Off = 0 // chunked: no offset is encoded, whatever follows
			}
			return r, err
		}, encodeBlob)
		roundTrip(t, "usage", b, decodeUsage, encodeUsage)
	})
}

func roundTrip[T any](t *testing.T, what string, b []byte, decode func([]byte) (T, error), encode func(T) []byte) {
	t.Helper()
	v, err := decode(b)
	if err != nil {
		if err != errCorrupt {
			t.Fatalf("%s: error %v, want errCorrupt", what, err)
		}
		return
	}
	again, err := decode(encode(v))
	if err != nil || !reflect.DeepEqual(again, v) {
		t.Fatalf("%s: %+v re-encoded decodes to %+v, %v", what, v, again, err)
	}
}
