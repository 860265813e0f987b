package embedded

import (
	"context"
	"errors"
	"reflect"
	"testing"

	"quill/internal/store"
	"quill/internal/store/storetest"
)

// SetMeta gives a summary to messages stored without one and to no other:
// not to one that has one, nor to an expunged or unknown UID (which it
// must not bring back). It changes no MODSEQ, no counter and no change log
// entry, and what it sets survives a reopen. With and without listCache,
// whose entries it must keep equal to the database.
func TestSetMeta(t *testing.T) {
	for _, cache := range []int{0, -1} {
		t.Run(map[int]string{0: "cached", -1: "uncached"}[cache], func(t *testing.T) {
			ctx := context.Background()
			dir := t.TempDir()
			e, err := Open(dir, Options{ListCacheBytes: cache})
			if err != nil {
				t.Fatal(err)
			}
			inbox := storetest.UserInbox(t, e, "a@example.test")
			body := []byte("Subject: s\r\n\r\nb\r\n")
			nm := store.NewMessage{Body: body, Size: int64(len(body))}
			withMeta := nm
			withMeta.Meta = []byte("old")
			msgs, err := writer(e).Append(ctx, inbox.ID, []store.NewMessage{nm, withMeta, nm}, store.AppendOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if _, _, err := writer(e).Expunge(ctx, inbox.ID, []uint32{msgs[2].UID}); err != nil {
				t.Fatal(err)
			}
			before, err := e.GetMailboxByID(ctx, inbox.ID)
			if err != nil {
				t.Fatal(err)
			}
			changes, err := e.Changes(ctx, inbox.ID, 0, 100)
			if err != nil {
				t.Fatal(err)
			}
			err = e.SetMeta(ctx, inbox.ID, map[uint32][]byte{
				msgs[0].UID: []byte("new"), msgs[1].UID: []byte("other"), msgs[2].UID: []byte("gone"), 99: []byte("unknown"),
			})
			if err != nil {
				t.Fatal(err)
			}
			check := func(e *Engine) {
				t.Helper()
				got, err := e.ListMessages(ctx, inbox.ID, 1, 100)
				if err != nil || len(got) != 2 {
					t.Fatalf("ListMessages = %d messages, %v", len(got), err)
				}
				if string(got[0].Meta) != "new" || string(got[1].Meta) != "old" {
					t.Errorf("Meta = %q, %q; want \"new\", \"old\"", got[0].Meta, got[1].Meta)
				}
				for i, m := range got {
					if m.ModSeq != msgs[i].ModSeq {
						t.Errorf("UID %d: MODSEQ %d, was %d", m.UID, m.ModSeq, msgs[i].ModSeq)
					}
				}
				if m, err := e.GetMessage(ctx, inbox.ID, msgs[0].UID); err != nil || string(m.Meta) != "new" {
					t.Errorf("GetMessage = %q, %v", m.Meta, err)
				}
				for _, uid := range []uint32{msgs[2].UID, 99} {
					if _, err := e.GetMessage(ctx, inbox.ID, uid); !errors.Is(err, store.ErrNotFound) {
						t.Errorf("GetMessage(%d) = %v, want ErrNotFound", uid, err)
					}
				}
				after, err := e.GetMailboxByID(ctx, inbox.ID)
				if err != nil || after != before {
					t.Errorf("mailbox %+v, %v; was %+v", after, err, before)
				}
				if c, err := e.Changes(ctx, inbox.ID, 0, 100); err != nil || !reflect.DeepEqual(c, changes) {
					t.Errorf("Changes = %v, %v; was %v", c, err, changes)
				}
				if problems, err := e.Check(ctx); err != nil || len(problems) > 0 {
					t.Errorf("Check = %v, %v", problems, err)
				}
			}
			check(e)
			if err := e.Close(); err != nil {
				t.Fatal(err)
			}
			e, err = Open(dir, Options{ListCacheBytes: cache})
			if err != nil {
				t.Fatal(err)
			}
			defer e.Close()
			check(e)
		})
	}
}
