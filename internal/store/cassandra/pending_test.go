package cassandra

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"quill/internal/store"
	"quill/internal/store/storetest"
)

// TestReadersShowPendingOperationWhole: an operation committed in the head
// but applied in part (the writer died, or was cut off, between its rows)
// is shown whole by every reader, with the HIGHESTMODSEQ beside it: a flag
// change whose first row is written and second is not shows both messages
// changed at its MODSEQ; an expunge whose row is not yet deleted hides the
// message; an append without rows lists its message. With the pending
// operation hidden instead, the half-written flag change showed one
// message at a MODSEQ above the HIGHESTMODSEQ reported beside it (what
// the robustness harness reported as modseq-decreased across two nodes),
// and a change log without the message whose superseded entry the apply
// step had deleted (reported as uid-order: a session polling it missed
// that message while it saw later ones).
func TestReadersShowPendingOperationWhole(t *testing.T) {
	ctx := context.Background()
	e := openTest(t, newKeyspace(t))
	defer e.Close()
	const user = "p@example.test"
	inbox := storetest.UserInbox(t, e, user)
	for i := range 3 {
		blob, n, err := e.PutBlob(ctx, strings.NewReader(fmt.Sprintf("message %d\r\n", i)), 0)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := e.Append(ctx, inbox.ID, []store.NewMessage{{Blob: blob, Size: n}}, store.AppendOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	// commit records o in the head as mutate's LWT would, and returns it.
	commit := func(kind opKind, uids []uint32, flags []string, extra func(*op)) *op {
		t.Helper()
		h, err := e.readHead(ctx, inbox.ID, true)
		if err != nil || h.pending != nil {
			t.Fatalf("head %+v, %v", h, err)
		}
		cur, err := e.readMessages(ctx, inbox.ID, uids)
		if err != nil {
			t.Fatal(err)
		}
		o := &op{ID: store.NewID(), Kind: kind, ModSeq: uint64(h.modSeq) + 1, Started: time.Now(),
			Before: counters{UIDNext: h.uidNext, ModSeq: h.modSeq, Messages: h.messages, Size: h.size},
			After:  counters{UIDNext: h.uidNext, ModSeq: h.modSeq + 1, Messages: h.messages, Size: h.size}}
		for _, u := range uids {
			m := cur[u]
			o.Msgs = append(o.Msgs, opMsg{UID: u, OldModSeq: m.ModSeq, Flags: flags, Date: m.InternalDate, Size: m.Size, Blob: m.Blob})
			if kind == opExpunge {
				o.After.Messages--
				o.After.Size -= m.Size
			}
		}
		if extra != nil {
			extra(o)
		}
		applied, err := e.cas(ctx, `UPDATE mailboxes SET uidnext = ?, modseq = ?, messages = ?, size = ?, pending = ? WHERE id = ? IF pending = null`,
			o.After.UIDNext, o.After.ModSeq, o.After.Messages, o.After.Size, mustJSON(t, o), inbox.ID[:]).MapScanCAS(map[string]any{})
		if err != nil || !applied {
			t.Fatalf("committing: %v, %v", applied, err)
		}
		return o
	}
	// view is what a reader sees: HIGHESTMODSEQ, every message's UID,
	// MODSEQ and flags, and the change log since since.
	type msgView struct {
		UID    uint32
		ModSeq uint64
		Flags  string
	}
	view := func(since uint64) (uint64, []msgView, []store.Change) {
		t.Helper()
		mb, err := e.GetMailboxByID(ctx, inbox.ID)
		if err != nil {
			t.Fatal(err)
		}
		msgs, err := e.ListMessages(ctx, inbox.ID, 1, 100)
		if err != nil {
			t.Fatal(err)
		}
		var out []msgView
		for _, m := range msgs {
			one, err := e.GetMessage(ctx, inbox.ID, m.UID)
			if err != nil || one.ModSeq != m.ModSeq || !slices.Equal(one.Flags, m.Flags) {
				t.Fatalf("GetMessage(%d) = %+v, %v; ListMessages says %+v", m.UID, one, err, m)
			}
			if m.ModSeq > mb.HighestModSeq || m.UID >= mb.UIDNext {
				t.Errorf("message %d at MODSEQ %d beside HIGHESTMODSEQ %d, UIDNEXT %d", m.UID, m.ModSeq, mb.HighestModSeq, mb.UIDNext)
			}
			out = append(out, msgView{m.UID, m.ModSeq, strings.Join(m.Flags, " ")})
		}
		if int(mb.Messages) != len(msgs) {
			t.Errorf("%d messages listed beside a count of %d", len(msgs), mb.Messages)
		}
		ch, err := e.Changes(ctx, inbox.ID, since, 100)
		if err != nil {
			t.Fatal(err)
		}
		return mb.HighestModSeq, out, ch
	}
	settle := func(o *op) {
		t.Helper()
		if err := e.finish(ctx, inbox.ID, o, mustJSON(t, o)); err != nil {
			t.Fatal(err)
		}
	}
	same := func(what string, before, after func() (uint64, []msgView, []store.Change)) {
		t.Helper()
		h1, m1, c1 := before()
		h2, m2, c2 := after()
		if h1 != h2 || !slices.Equal(m1, m2) || !slices.Equal(c1, c2) {
			t.Errorf("%s: readers saw\n  %d %v %v\nwhile pending, and\n  %d %v %v\nonce applied", what, h1, m1, c1, h2, m2, c2)
		}
	}

	// A flag change of UIDs 1 and 2 whose row of UID 1 alone is written.
	base, _, _ := view(0)
	o := commit(opFlags, []uint32{1, 2}, []string{`\Seen`}, nil)
	if err := e.write(ctx, `UPDATE messages SET flags = ?, modseq = ? WHERE mailbox = ? AND bucket = 0 AND uid = ?`,
		`\Seen`, int64(o.ModSeq), inbox.ID[:], int64(1)).WithTimestamp(int64(o.ModSeq)).Exec(); err != nil {
		t.Fatal(err)
	}
	// ... and the superseded change log entry of UID 1 deleted, as the
	// apply step does after the new entries: a reader polling the change
	// log from before UID 1 was added must still find UID 1 (the harness
	// saw a session miss a message whose flags changed meanwhile).
	if err := e.write(ctx, `DELETE FROM changes WHERE mailbox = ? AND bucket = 0 AND modseq = ? AND uid = ?`,
		inbox.ID[:], int64(o.Msgs[0].OldModSeq), int64(1)).WithTimestamp(int64(o.ModSeq)).Exec(); err != nil {
		t.Fatal(err)
	}
	if all, err := e.Changes(ctx, inbox.ID, 0, 100); err != nil || !slices.ContainsFunc(all, func(c store.Change) bool { return c.UID == 1 }) {
		t.Fatalf("the change log from the start, with a flag change of UID 1 pending, = %v, %v: UID 1 missing", all, err)
	}
	pending := func() (uint64, []msgView, []store.Change) { return view(base) }
	h, msgs, ch := pending()
	if h != o.ModSeq || msgs[0].Flags != `\Seen` || msgs[1].Flags != `\Seen` || msgs[0].ModSeq != o.ModSeq || msgs[1].ModSeq != o.ModSeq {
		t.Fatalf("half-written flag change: HIGHESTMODSEQ %d, messages %v", h, msgs)
	}
	if len(ch) != 2 || ch[0] != (store.Change{ModSeq: o.ModSeq, UID: 1, Kind: store.ChangeFlags}) || ch[1].UID != 2 {
		t.Fatalf("half-written flag change: changes since %d = %v", base, ch)
	}
	snap := func(h uint64, m []msgView, c []store.Change) func() (uint64, []msgView, []store.Change) {
		return func() (uint64, []msgView, []store.Change) { return h, m, c }
	}
	settle(o)
	same("flag change", snap(h, msgs, ch), pending)

	// An expunge of UID 3, none of its rows written.
	base = o.ModSeq
	o = commit(opExpunge, []uint32{3}, nil, nil)
	h, msgs, ch = pending()
	if h != o.ModSeq || len(msgs) != 2 || len(ch) != 1 || ch[0].Kind != store.ChangeExpunged || ch[0].UID != 3 {
		t.Fatalf("unwritten expunge: HIGHESTMODSEQ %d, messages %v, changes %v", h, msgs, ch)
	}
	if _, err := e.GetMessage(ctx, inbox.ID, 3); !strings.Contains(fmt.Sprint(err), "not found") {
		t.Fatalf("GetMessage of the expunged UID: %v", err)
	}
	settle(o)
	same("expunge", snap(h, msgs, ch), pending)

	// An append of UID 4, none of its rows written.
	base = o.ModSeq
	blob, n, err := e.PutBlob(ctx, strings.NewReader("appended\r\n"), 0)
	if err != nil {
		t.Fatal(err)
	}
	o = commit(opAppend, nil, nil, func(o *op) {
		o.Msgs = []opMsg{{UID: uint32(o.Before.UIDNext), Flags: []string{"$Label"}, Size: n, Blob: blob, Date: time.Now().UTC().Truncate(time.Millisecond)}}
		o.After.UIDNext++
		o.After.Messages++
		o.After.Size += n
	})
	h, msgs, ch = pending()
	if h != o.ModSeq || len(msgs) != 3 || msgs[2].UID != 4 || msgs[2].Flags != "$Label" || len(ch) != 1 || ch[0].Kind != store.ChangeAdded {
		t.Fatalf("unwritten append: HIGHESTMODSEQ %d, messages %v, changes %v", h, msgs, ch)
	}
	if page, err := e.ListMessages(ctx, inbox.ID, 1, 2); err != nil || len(page) != 2 || page[1].UID != 2 {
		t.Fatalf("a page of 2 from UID 1 with an append pending = %+v, %v", page, err)
	}
	settle(o)
	same("append", snap(h, msgs, ch), pending)
	if problems, err := e.Check(ctx); err != nil || len(problems) > 0 {
		t.Fatalf("Check = %v, %v", problems, err)
	}
}
