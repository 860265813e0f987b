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
	f.Add(encodeExpunged([]uint32{7, 8, 9, 12, 40}))
	f.Fuzz(func(t *testing.T, b []byte) {
		roundTrip(t, "user", b, decodeUser, encodeUser)
		if u, err := decodeUser(b); err == nil {
			if q, err := decodeQuota(b); err != nil || q != u.QuotaBytes {
				t.Fatalf("decodeQuota = %d, %v; the record's quota is %d", q, err, u.QuotaBytes)
			}
		}
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
		changes, err := decodeChanges(nil, 9, 7, b)
		switch {
		case err != nil:
			if err != errCorrupt {
				t.Fatalf("changes: error %v, want errCorrupt", err)
			}
		case len(changes) > maxExpungedPerEntry:
			t.Fatalf("changes: %d from one entry, over %d", len(changes), maxExpungedPerEntry)
		case len(changes) > 1:
			uids := make([]uint32, len(changes))
			for i, c := range changes {
				uids[i] = c.UID
				if i > 0 && uids[i] <= uids[i-1] {
					t.Fatalf("changes: UIDs %v not ascending", uids)
				}
			}
			again, err := decodeChanges(nil, 9, 7, encodeExpunged(uids))
			if err != nil || !reflect.DeepEqual(again, changes) {
				t.Fatalf("changes: %+v re-encoded decodes to %+v, %v", changes, again, err)
			}
		}
	})
}

// TestExpungedEncoding: the run-length form of one expunge's UIDs, and the
// single-UID form that entries had before it.
func TestExpungedEncoding(t *testing.T) {
	for _, uids := range [][]uint32{{7}, {7, 8}, {7, 9}, {7, 8, 9, 20, 21, 4000000000}, {7, 1<<32 - 1}} {
		v := encodeExpunged(uids)
		if len(uids) == 1 && len(v) != 1 {
			t.Errorf("one UID encodes to % x, want the kind alone", v)
		}
		changes, err := decodeChanges(nil, 3, uids[0], v)
		if err != nil || len(changes) != len(uids) {
			t.Fatalf("%v: decoded %+v, %v", uids, changes, err)
		}
		for i, c := range changes {
			if c != (store.Change{ModSeq: 3, UID: uids[i], Kind: store.ChangeExpunged}) {
				t.Fatalf("%v: change %d = %+v", uids, i, c)
			}
		}
	}
	for _, v := range [][]byte{nil, {byte(store.ChangeFlags), 0}, {byte(store.ChangeExpunged), 0x80}} {
		if _, err := decodeChanges(nil, 3, 7, v); err != errCorrupt {
			t.Errorf("% x: %v, want errCorrupt", v, err)
		}
	}
	// A run past the UID space, and an entry claiming more UIDs than an
	// expunge writes to one, are corrupt.
	if _, err := decodeChanges(nil, 3, 1<<32-1, encodeExpunged([]uint32{1<<32 - 2, 1<<32 - 1})); err != errCorrupt {
		t.Errorf("run past the UID space: %v, want errCorrupt", err)
	}
	long := enc{byte(store.ChangeExpunged)}
	long.uvarint(maxExpungedPerEntry) // a run of maxExpungedPerEntry+1
	if _, err := decodeChanges(nil, 3, 7, long); err != errCorrupt {
		t.Errorf("run of %d: %v, want errCorrupt", maxExpungedPerEntry+1, err)
	}
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
