package cassandra

import (
	"slices"

	"quill/internal/store"
)

// The readers' view of a pending operation (see the package comment): it
// is committed, so readers show the mailbox after it, whatever of its rows
// are written yet. Its record carries everything they need: the UIDs it
// touches, the flags it sets, and an appended message whole.

// message returns m as the operation leaves it, and whether it exists then.
// m is the row read for m.UID (its zero value if none was found).
func (o *op) message(m store.Message, found bool, uid uint32) (store.Message, bool) {
	for _, x := range o.Msgs {
		if x.UID != uid {
			continue
		}
		switch o.Kind {
		case opAppend:
			return store.Message{UID: uid, ModSeq: o.ModSeq, Flags: x.Flags, InternalDate: x.Date, Size: x.Size, Blob: x.Blob, Meta: x.Meta}, true
		case opFlags:
			if found {
				m.Flags, m.ModSeq = x.Flags, o.ModSeq
			}
			return m, found
		case opExpunge:
			return store.Message{}, false
		}
	}
	return m, found
}

// overlay turns msgs, the rows read in UID order from UID from on, into
// the messages as the operation leaves them: its expunged UIDs gone, its
// flag changes made, its appended messages present (they have the highest
// UIDs, so they follow every row).
func (o *op) overlay(msgs []store.Message, from uint32) []store.Message {
	switch o.Kind {
	case opExpunge:
		return slices.DeleteFunc(msgs, func(m store.Message) bool {
			_, keep := o.message(m, true, m.UID)
			return !keep
		})
	case opFlags:
		for i := range msgs {
			msgs[i], _ = o.message(msgs[i], true, msgs[i].UID)
		}
	case opAppend:
		present := map[uint32]bool{}
		for _, m := range msgs {
			present[m.UID] = true
		}
		for _, x := range o.Msgs {
			if x.UID >= from && !present[x.UID] {
				m, _ := o.message(store.Message{}, false, x.UID)
				msgs = append(msgs, m)
			}
		}
		slices.SortFunc(msgs, func(a, b store.Message) int { return int(a.UID) - int(b.UID) })
	}
	return msgs
}

// changes returns the change log entries the operation writes, by UID.
func (o *op) changes() []store.Change {
	kind := map[opKind]store.ChangeKind{opAppend: store.ChangeAdded, opFlags: store.ChangeFlags, opExpunge: store.ChangeExpunged}[o.Kind]
	out := make([]store.Change, len(o.Msgs))
	for i, x := range o.Msgs {
		out[i] = store.Change{ModSeq: o.ModSeq, UID: x.UID, Kind: kind}
	}
	slices.SortFunc(out, func(a, b store.Change) int { return int(a.UID) - int(b.UID) })
	return out
}
