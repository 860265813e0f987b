package store

import (
	"errors"
	"testing"
)

// TestValidateAddedOrder: a mailbox's additions must come in ascending
// UID order with MODSEQs that do not decrease (the Cassandra engine finds
// the messages added after a MODSEQ by their UIDs); additions to another
// mailbox interleaved do not matter.
func TestValidateAddedOrder(t *testing.T) {
	a, b := ID{1}, ID{2}
	add := func(mb ID, uid uint32, modseq uint64) AddedMessage {
		return AddedMessage{Mailbox: mb, Message: Message{UID: uid, ModSeq: modseq, Blob: ID{9}}}
	}
	heads := []HeadChange{{Mailbox: a, UIDNext: 10, HighestModSeq: 10}, {Mailbox: b, UIDNext: 10, HighestModSeq: 10}}
	for _, c := range []struct {
		name  string
		added []AddedMessage
		ok    bool
	}{
		{"ascending, one MODSEQ", []AddedMessage{add(a, 1, 5), add(a, 2, 5), add(a, 3, 5)}, true},
		{"ascending, rising MODSEQs", []AddedMessage{add(a, 1, 5), add(a, 2, 6)}, true},
		{"interleaved mailboxes", []AddedMessage{add(a, 5, 7), add(b, 1, 2), add(a, 6, 7), add(b, 2, 3)}, true},
		{"UIDs descending", []AddedMessage{add(a, 2, 5), add(a, 1, 5)}, false},
		{"one UID twice", []AddedMessage{add(a, 2, 5), add(a, 2, 5)}, false},
		{"MODSEQ falls as the UID rises", []AddedMessage{add(a, 1, 6), add(a, 2, 5)}, false},
	} {
		bt := &Batch{User: "u", Epoch: 1, Heads: heads, Added: c.added}
		err := bt.Validate()
		if c.ok && err != nil {
			t.Errorf("%s: %v", c.name, err)
		}
		if !c.ok && !errors.Is(err, ErrInvalid) {
			t.Errorf("%s: %v, want ErrInvalid", c.name, err)
		}
	}
}
