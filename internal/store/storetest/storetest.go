// Package storetest is the conformance suite every store engine must pass.
// It uses only the store.Store contract and assumes nothing about how many
// processes share the store: concurrency is exercised through the contract
// and invariants are checked by what a reader can observe.
package storetest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"quill/internal/store"
)

// Factory returns a fresh, empty store for one test; the suite closes it.
type Factory func(t *testing.T) store.Store

// Run runs the whole suite.
func Run(t *testing.T, newStore Factory) {
	tests := []struct {
		name string
		fn   func(*testing.T, store.Store)
	}{
		{"Users", testUsers},
		{"Aliases", testAliases},
		{"Mailboxes", testMailboxes},
		{"Rename", testRename},
		{"UIDValidityNeverRepeats", testUIDValidity},
		{"Blobs", testBlobs},
		{"Append", testAppend},
		{"Quota", testQuota},
		{"Flags", testFlags},
		{"Expunge", testExpunge},
		{"ChangesKeepModSeqsWhole", testChangesWholeModSeq},
		{"ListAroundExpunged", testListAroundExpunged},
		{"SharedBlob", testSharedBlob},
		{"InlineBody", testInlineBody},
		{"DeleteUser", testDeleteUser},
		{"ConcurrentAppendOrder", testConcurrentAppend},
		{"MaildropLease", testMaildropLease},
		{"Secrets", testSecrets},
		{"Ownership", testOwnership},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := newStore(t)
			defer func() {
				problems, err := s.Check(context.Background())
				if err != nil {
					t.Errorf("Check: %v", err)
				}
				for _, p := range problems {
					t.Errorf("Check: %s", p)
				}
				if err := s.Close(); err != nil {
					t.Errorf("Close: %v", err)
				}
			}()
			tc.fn(t, s)
		})
	}
}

func ctx() context.Context { return context.Background() }

func mustUser(t *testing.T, s store.Store, addr string, quota int64) {
	t.Helper()
	if err := s.CreateUser(ctx(), store.User{Address: addr, PasswordHash: "h", QuotaBytes: quota}); err != nil {
		t.Fatalf("CreateUser(%s): %v", addr, err)
	}
}

func mustMailbox(t *testing.T, s store.Store, user, name string) store.Mailbox {
	t.Helper()
	m, err := s.GetMailbox(ctx(), user, name)
	if err != nil {
		t.Fatalf("GetMailbox(%s, %s): %v", user, name, err)
	}
	return m
}

func mustBlob(t *testing.T, s store.Store, body string) (store.ID, int64) {
	t.Helper()
	id, n, err := s.PutBlob(ctx(), strings.NewReader(body), 0)
	if err != nil {
		t.Fatalf("PutBlob: %v", err)
	}
	if n != int64(len(body)) {
		t.Fatalf("PutBlob size = %d, want %d", n, len(body))
	}
	return id, n
}

func mustAppend(t *testing.T, s store.Store, mbox store.ID, bodies ...string) []store.Message {
	t.Helper()
	var msgs []store.NewMessage
	for _, b := range bodies {
		id, n := mustBlob(t, s, b)
		msgs = append(msgs, store.NewMessage{Blob: id, Size: n, InternalDate: time.Now()})
	}
	out, err := s.Append(ctx(), mbox, msgs, store.AppendOptions{})
	if err != nil {
		t.Fatalf("Append: %v", err)
	}
	return out
}

// releaseWait bounds how long after the expunge of a blob's last
// reference has returned the blob may still be there. The store contract
// deletes a blob only after its last reference is gone, not at once: the
// Cassandra engine's batch mode collects expunged messages and their blobs
// once the expunge is acknowledged and its head read back (ADR 0026).
const releaseWait = 30 * time.Second

// blobReleased waits, up to releaseWait, until OpenBlob reports id
// missing.
func blobReleased(t *testing.T, s store.Store, id store.ID, what string) {
	t.Helper()
	deadline := time.Now().Add(releaseWait)
	for {
		r, err := s.OpenBlob(ctx(), id)
		if err == nil {
			r.Close()
		}
		if errors.Is(err, store.ErrNotFound) {
			return
		}
		if err != nil || time.Now().After(deadline) {
			t.Fatalf("%s: err = %v after %s, want %v", what, err, releaseWait, store.ErrNotFound)
		}
		time.Sleep(10 * time.Millisecond) // polling a condition with a deadline
	}
}

func wantErr(t *testing.T, what string, err, target error) {
	t.Helper()
	if !errors.Is(err, target) {
		t.Fatalf("%s: err = %v, want %v", what, err, target)
	}
}

func testUsers(t *testing.T, s store.Store) {
	mustUser(t, s, "alice@example.test", 1000)
	wantErr(t, "duplicate user", s.CreateUser(ctx(), store.User{Address: "alice@example.test"}), store.ErrExists)
	u, err := s.GetUser(ctx(), "alice@example.test")
	if err != nil || u.Address != "alice@example.test" || u.PasswordHash != "h" || u.QuotaBytes != 1000 || u.Status != store.UserActive {
		t.Fatalf("GetUser = %+v, %v", u, err)
	}
	_, err = s.GetUser(ctx(), "nobody@example.test")
	wantErr(t, "GetUser(missing)", err, store.ErrNotFound)

	u.PasswordHash, u.QuotaBytes, u.Status = "h2", 0, store.UserDisabled
	if err := s.UpdateUser(ctx(), u); err != nil {
		t.Fatal(err)
	}
	if u2, _ := s.GetUser(ctx(), u.Address); u2.PasswordHash != "h2" || u2.QuotaBytes != 0 || u2.Status != store.UserDisabled {
		t.Fatalf("after UpdateUser: %+v", u2)
	}
	wantErr(t, "UpdateUser(missing)", s.UpdateUser(ctx(), store.User{Address: "x@example.test"}), store.ErrNotFound)
	wantErr(t, "CreateUser(empty)", s.CreateUser(ctx(), store.User{}), store.ErrInvalid)

	for i := 0; i < 25; i++ {
		mustUser(t, s, fmt.Sprintf("u%02d@example.test", i), 0)
	}
	var all []string
	after := ""
	for {
		page, err := s.ListUsers(ctx(), after, 7)
		if err != nil {
			t.Fatal(err)
		}
		if len(page) == 0 {
			break
		}
		for _, u := range page {
			all = append(all, u.Address)
		}
		after = page[len(page)-1].Address
	}
	if len(all) != 26 || !slices.IsSorted(all) || all[0] != "alice@example.test" {
		t.Fatalf("ListUsers paged = %v", all)
	}
	if u, _ := s.Usage(ctx(), "u00@example.test"); u != (store.Usage{}) {
		t.Fatalf("Usage of new user = %+v", u)
	}
	_, err = s.Usage(ctx(), "nobody@example.test")
	wantErr(t, "Usage(missing)", err, store.ErrNotFound)
}

func testAliases(t *testing.T, s store.Store) {
	mustUser(t, s, "bob@example.test", 0)
	if err := s.CreateAlias(ctx(), "robert@example.test", "bob@example.test"); err != nil {
		t.Fatal(err)
	}
	wantErr(t, "alias onto user", s.CreateAlias(ctx(), "bob@example.test", "bob@example.test"), store.ErrExists)
	wantErr(t, "duplicate alias", s.CreateAlias(ctx(), "robert@example.test", "bob@example.test"), store.ErrExists)
	wantErr(t, "alias to missing", s.CreateAlias(ctx(), "x@example.test", "nobody@example.test"), store.ErrNotFound)
	wantErr(t, "user onto alias", s.CreateUser(ctx(), store.User{Address: "robert@example.test"}), store.ErrExists)

	for addr, want := range map[string]string{"bob@example.test": "bob@example.test", "robert@example.test": "bob@example.test"} {
		if got, err := s.Resolve(ctx(), addr); err != nil || got != want {
			t.Fatalf("Resolve(%s) = %q, %v", addr, got, err)
		}
	}
	_, err := s.Resolve(ctx(), "nobody@example.test")
	wantErr(t, "Resolve(missing)", err, store.ErrNotFound)
	list, err := s.ListAliases(ctx())
	if err != nil || len(list) != 1 || list[0] != [2]string{"robert@example.test", "bob@example.test"} {
		t.Fatalf("ListAliases = %v, %v", list, err)
	}
	if err := s.DeleteAlias(ctx(), "robert@example.test"); err != nil {
		t.Fatal(err)
	}
	wantErr(t, "DeleteAlias twice", s.DeleteAlias(ctx(), "robert@example.test"), store.ErrNotFound)
	_, err = s.Resolve(ctx(), "robert@example.test")
	wantErr(t, "Resolve(deleted alias)", err, store.ErrNotFound)
}

func testMailboxes(t *testing.T, s store.Store) {
	const u = "carol@example.test"
	mustUser(t, s, u, 0)
	inbox := mustMailbox(t, s, u, "INBOX")
	if inbox.UIDNext != 1 || inbox.UIDValidity == 0 || inbox.Messages != 0 || !inbox.Subscribed {
		t.Fatalf("new INBOX = %+v", inbox)
	}
	if m := mustMailbox(t, s, u, "inbox"); m.ID != inbox.ID {
		t.Fatal("INBOX is not case-insensitive")
	}
	_, err := s.CreateMailbox(ctx(), u, "Inbox", store.MailboxOptions{})
	wantErr(t, "CreateMailbox(Inbox)", err, store.ErrExists)
	sent, err := s.CreateMailbox(ctx(), u, "Sent", store.MailboxOptions{SpecialUse: `\Sent`, Subscribed: true})
	if err != nil || sent.SpecialUse != `\Sent` || sent.ID == inbox.ID || sent.UIDValidity == 0 {
		t.Fatalf("CreateMailbox(Sent) = %+v, %v", sent, err)
	}
	_, err = s.CreateMailbox(ctx(), u, "Sent", store.MailboxOptions{})
	wantErr(t, "duplicate mailbox", err, store.ErrExists)
	_, err = s.CreateMailbox(ctx(), "nobody@example.test", "X", store.MailboxOptions{})
	wantErr(t, "mailbox of missing user", err, store.ErrNotFound)
	for _, bad := range []string{"", "/a", "a/", "a//b", "a\x00b"} {
		_, err = s.CreateMailbox(ctx(), u, bad, store.MailboxOptions{})
		wantErr(t, fmt.Sprintf("CreateMailbox(%q)", bad), err, store.ErrInvalid)
	}
	if _, err := s.CreateMailbox(ctx(), u, "Archive/2026", store.MailboxOptions{}); err != nil {
		t.Fatal(err)
	}
	list, err := s.ListMailboxes(ctx(), u)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, m := range list {
		names = append(names, m.Name)
	}
	if !slices.Equal(names, []string{"Archive/2026", "INBOX", "Sent"}) {
		t.Fatalf("ListMailboxes = %v", names)
	}
	if err := s.SetSubscribed(ctx(), u, "Sent", false); err != nil {
		t.Fatal(err)
	}
	if m := mustMailbox(t, s, u, "Sent"); m.Subscribed {
		t.Fatal("SetSubscribed(false) did not stick")
	}
	byID, err := s.GetMailboxByID(ctx(), sent.ID)
	if err != nil || byID.Name != "Sent" || byID.User != u {
		t.Fatalf("GetMailboxByID = %+v, %v", byID, err)
	}
	wantErr(t, "DeleteMailbox(INBOX)", s.DeleteMailbox(ctx(), u, "INBOX"), store.ErrInvalid)
	mustAppend(t, s, sent.ID, "sent message\r\n")
	if err := s.DeleteMailbox(ctx(), u, "Sent"); err != nil {
		t.Fatal(err)
	}
	_, err = s.GetMailbox(ctx(), u, "Sent")
	wantErr(t, "GetMailbox(deleted)", err, store.ErrNotFound)
	_, err = s.GetMailboxByID(ctx(), sent.ID)
	wantErr(t, "GetMailboxByID(deleted)", err, store.ErrNotFound)
	if us, _ := s.Usage(ctx(), u); us != (store.Usage{}) {
		t.Fatalf("usage after deleting the only non-empty mailbox = %+v", us)
	}
}

func testRename(t *testing.T, s store.Store) {
	const u = "dave@example.test"
	mustUser(t, s, u, 0)
	for _, n := range []string{"Work", "Work/A", "Work/A/B", "Workshop", "Other"} {
		if _, err := s.CreateMailbox(ctx(), u, n, store.MailboxOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	a := mustMailbox(t, s, u, "Work/A")
	msgs := mustAppend(t, s, a.ID, "hello\r\n")
	if err := s.RenameMailbox(ctx(), u, "Work", "Jobs"); err != nil {
		t.Fatal(err)
	}
	list, _ := s.ListMailboxes(ctx(), u)
	var names []string
	for _, m := range list {
		names = append(names, m.Name)
	}
	if !slices.Equal(names, []string{"INBOX", "Jobs", "Jobs/A", "Jobs/A/B", "Other", "Workshop"}) {
		t.Fatalf("after rename: %v", names)
	}
	moved := mustMailbox(t, s, u, "Jobs/A")
	if moved.ID != a.ID || moved.UIDValidity != a.UIDValidity || moved.Messages != 1 {
		t.Fatalf("renamed mailbox lost identity or contents: %+v", moved)
	}
	if got, err := s.GetMessage(ctx(), moved.ID, msgs[0].UID); err != nil || got.Blob != msgs[0].Blob {
		t.Fatalf("message after rename: %+v, %v", got, err)
	}
	wantErr(t, "rename onto existing", s.RenameMailbox(ctx(), u, "Jobs", "Other"), store.ErrExists)
	wantErr(t, "rename missing", s.RenameMailbox(ctx(), u, "Nope", "Nope2"), store.ErrNotFound)
	wantErr(t, "rename INBOX", s.RenameMailbox(ctx(), u, "INBOX", "Old"), store.ErrInvalid)
	wantErr(t, "rename into itself", s.RenameMailbox(ctx(), u, "Jobs", "Jobs/Sub"), store.ErrInvalid)
}

func testUIDValidity(t *testing.T, s store.Store) {
	const u = "erin@example.test"
	mustUser(t, s, u, 0)
	seen := map[uint32]bool{mustMailbox(t, s, u, "INBOX").UIDValidity: true}
	for i := 0; i < 5; i++ {
		m, err := s.CreateMailbox(ctx(), u, "Temp", store.MailboxOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if seen[m.UIDValidity] {
			t.Fatalf("UIDVALIDITY %d handed out twice", m.UIDValidity)
		}
		seen[m.UIDValidity] = true
		if err := s.DeleteMailbox(ctx(), u, "Temp"); err != nil {
			t.Fatal(err)
		}
	}
}

func testBlobs(t *testing.T, s store.Store) {
	rng := rand.New(rand.NewPCG(1, 2))
	for _, size := range []int{0, 1, 4700, 256 << 10, 256<<10 + 1, 1<<20 + 12345} {
		body := make([]byte, size)
		for i := range body {
			body[i] = byte(rng.IntN(256))
		}
		id, n, err := s.PutBlob(ctx(), bytes.NewReader(body), 0)
		if err != nil || n != int64(size) {
			t.Fatalf("PutBlob(%d) = %d, %v", size, n, err)
		}
		r, err := s.OpenBlob(ctx(), id)
		if err != nil {
			t.Fatal(err)
		}
		if r.Size() != int64(size) {
			t.Fatalf("Size = %d, want %d", r.Size(), size)
		}
		got, err := io.ReadAll(r)
		if err != nil || !bytes.Equal(got, body) {
			t.Fatalf("ReadAll of %d-byte blob: %d bytes, %v", size, len(got), err)
		}
		for i := 0; i < 20 && size > 0; i++ {
			off := rng.IntN(size)
			buf := make([]byte, rng.IntN(size-off)+1)
			if n, err := r.ReadAt(buf, int64(off)); n != len(buf) || (err != nil && err != io.EOF) || !bytes.Equal(buf, body[off:off+len(buf)]) {
				t.Fatalf("ReadAt(%d, %d) = %d, %v", off, len(buf), n, err)
			}
		}
		if _, err := r.Seek(int64(size/2), io.SeekStart); err != nil {
			t.Fatal(err)
		}
		if rest, _ := io.ReadAll(r); !bytes.Equal(rest, body[size/2:]) {
			t.Fatal("read after Seek differs")
		}
		r.Close()
	}
	_, _, err := s.PutBlob(ctx(), strings.NewReader(strings.Repeat("x", 1000)), 999)
	if err == nil {
		t.Fatal("PutBlob over maxSize succeeded")
	}
	// A body of exactly maxSize is whole, below a chunk and above one.
	for _, size := range []int{1000, 300 << 10} {
		body := bytes.Repeat([]byte("y"), size)
		id, n, err := s.PutBlob(ctx(), bytes.NewReader(body), int64(size))
		if err != nil || n != int64(size) {
			t.Fatalf("PutBlob of %d bytes, maxSize %d: %d, %v", size, size, n, err)
		}
		r, err := s.OpenBlob(ctx(), id)
		if err != nil {
			t.Fatal(err)
		}
		got, err := io.ReadAll(r)
		r.Close()
		if err != nil || !bytes.Equal(got, body) {
			t.Fatalf("ReadAll of the %d-byte blob stored at maxSize: %d bytes, %v", size, len(got), err)
		}
	}
	boom := errors.New("connection reset")
	_, _, err = s.PutBlob(ctx(), io.MultiReader(strings.NewReader("partial"), errReader{boom}), 0)
	wantErr(t, "PutBlob with failing reader", err, boom)
	// A reader reports a body cut short (a client gone mid-DATA) as
	// io.ErrUnexpectedEOF: that is a failure, never the end of the body.
	_, _, err = s.PutBlob(ctx(), io.MultiReader(strings.NewReader("truncated"), errReader{io.ErrUnexpectedEOF}), 0)
	wantErr(t, "PutBlob with a body cut short", err, io.ErrUnexpectedEOF)
	_, err = s.OpenBlob(ctx(), store.NewID())
	wantErr(t, "OpenBlob(missing)", err, store.ErrNotFound)
}

type errReader struct{ err error }

func (r errReader) Read([]byte) (int, error) { return 0, r.err }

func testAppend(t *testing.T, s store.Store) {
	const u = "frank@example.test"
	mustUser(t, s, u, 0)
	inbox := mustMailbox(t, s, u, "INBOX")
	first := mustAppend(t, s, inbox.ID, "one\r\n")
	batch := mustAppend(t, s, inbox.ID, "two\r\n", "three!\r\n")
	if first[0].UID != 1 || batch[0].UID != 2 || batch[1].UID != 3 {
		t.Fatalf("UIDs = %d, %d, %d", first[0].UID, batch[0].UID, batch[1].UID)
	}
	if !(first[0].ModSeq < batch[0].ModSeq && batch[0].ModSeq == batch[1].ModSeq) {
		t.Fatalf("ModSeqs = %d, %d, %d", first[0].ModSeq, batch[0].ModSeq, batch[1].ModSeq)
	}
	m := mustMailbox(t, s, u, "INBOX")
	if m.UIDNext != 4 || m.Messages != 3 || m.Size != 5+5+8 || m.HighestModSeq != batch[0].ModSeq {
		t.Fatalf("mailbox after appends = %+v", m)
	}
	if us, _ := s.Usage(ctx(), u); us != (store.Usage{Bytes: 18, Messages: 3}) {
		t.Fatalf("usage = %+v", us)
	}
	msgs, err := s.ListMessages(ctx(), inbox.ID, 2, 10)
	if err != nil || len(msgs) != 2 || msgs[0].UID != 2 || msgs[1].UID != 3 {
		t.Fatalf("ListMessages(from 2) = %+v, %v", msgs, err)
	}
	if msgs, _ := s.ListMessages(ctx(), inbox.ID, 1, 2); len(msgs) != 2 || msgs[1].UID != 2 {
		t.Fatalf("ListMessages limit 2 = %+v", msgs)
	}
	date := time.Date(2024, 2, 29, 12, 30, 0, 0, time.UTC)
	id, n := mustBlob(t, s, "flagged\r\n")
	got, err := s.Append(ctx(), inbox.ID, []store.NewMessage{{
		Blob: id, Size: n, InternalDate: date, Flags: []string{`\Seen`, "$Label1", `\Seen`}, Meta: []byte("meta"),
	}}, store.AppendOptions{})
	if err != nil {
		t.Fatal(err)
	}
	back, err := s.GetMessage(ctx(), inbox.ID, got[0].UID)
	if err != nil || !back.InternalDate.Equal(date) || !slices.Equal(back.Flags, []string{"$Label1", `\Seen`}) ||
		string(back.Meta) != "meta" || back.Size != n || back.Blob != id {
		t.Fatalf("GetMessage = %+v, %v", back, err)
	}
	_, err = s.GetMessage(ctx(), inbox.ID, 99)
	wantErr(t, "GetMessage(missing)", err, store.ErrNotFound)
	_, err = s.Append(ctx(), store.NewID(), []store.NewMessage{{Blob: id, Size: n}}, store.AppendOptions{})
	wantErr(t, "Append to missing mailbox", err, store.ErrNotFound)
	_, err = s.Append(ctx(), inbox.ID, []store.NewMessage{{Blob: id, Size: n, Flags: []string{`\Recent`}}}, store.AppendOptions{})
	wantErr(t, `Append with \Recent`, err, store.ErrInvalid)
	_, err = s.Append(ctx(), inbox.ID, []store.NewMessage{{Blob: store.NewID(), Size: 1}}, store.AppendOptions{})
	wantErr(t, "Append of missing blob", err, store.ErrNotFound)
	changes, err := s.Changes(ctx(), inbox.ID, 0, 100)
	if err != nil || len(changes) != 4 {
		t.Fatalf("Changes = %+v, %v", changes, err)
	}
	for i, c := range changes {
		if c.Kind != store.ChangeAdded || c.UID != uint32(i+1) {
			t.Fatalf("change %d = %+v", i, c)
		}
	}
	if later, _ := s.Changes(ctx(), inbox.ID, first[0].ModSeq, 100); len(later) != 3 {
		t.Fatalf("Changes since %d = %+v", first[0].ModSeq, later)
	}
}

func testQuota(t *testing.T, s store.Store) {
	const u = "gina@example.test"
	mustUser(t, s, u, 100)
	inbox := mustMailbox(t, s, u, "INBOX")
	small, n := mustBlob(t, s, strings.Repeat("a", 60))
	if _, err := s.Append(ctx(), inbox.ID, []store.NewMessage{{Blob: small, Size: n}}, store.AppendOptions{CheckQuota: true}); err != nil {
		t.Fatal(err)
	}
	big, n := mustBlob(t, s, strings.Repeat("b", 41))
	_, err := s.Append(ctx(), inbox.ID, []store.NewMessage{{Blob: big, Size: n}}, store.AppendOptions{CheckQuota: true})
	wantErr(t, "Append over quota", err, store.ErrOverQuota)
	if _, err := s.Append(ctx(), inbox.ID, []store.NewMessage{{Blob: big, Size: n}}, store.AppendOptions{}); err != nil {
		t.Fatalf("Append without CheckQuota: %v", err)
	}
	if us, _ := s.Usage(ctx(), u); us.Bytes != 101 || us.Messages != 2 {
		t.Fatalf("usage = %+v", us)
	}
}

func testFlags(t *testing.T, s store.Store) {
	const u = "hank@example.test"
	mustUser(t, s, u, 0)
	inbox := mustMailbox(t, s, u, "INBOX")
	msgs := mustAppend(t, s, inbox.ID, "1\r\n", "2\r\n", "3\r\n")
	base := msgs[0].ModSeq
	res, err := s.SetFlags(ctx(), inbox.ID, store.FlagChange{UIDs: []uint32{1, 2, 99}, Op: store.FlagsAdd, Flags: []string{`\Seen`}})
	if err != nil || len(res.Changed) != 2 || res.Changed[0].ModSeq <= base || len(res.Failed) != 0 {
		t.Fatalf("SetFlags add = %+v, %v", res, err)
	}
	m1 := res.Changed[0].ModSeq
	// Adding a flag that is already there changes nothing and uses no MODSEQ.
	res, err = s.SetFlags(ctx(), inbox.ID, store.FlagChange{UIDs: []uint32{1}, Op: store.FlagsAdd, Flags: []string{`\Seen`}})
	if err != nil || len(res.Changed) != 0 {
		t.Fatalf("idempotent SetFlags = %+v, %v", res, err)
	}
	res, err = s.SetFlags(ctx(), inbox.ID, store.FlagChange{UIDs: []uint32{1, 3}, Op: store.FlagsReplace, Flags: []string{`\Flagged`, "Work"}, UnchangedSince: base})
	if err != nil || len(res.Changed) != 1 || res.Changed[0].UID != 3 || !slices.Equal(res.Failed, []uint32{1}) {
		t.Fatalf("SetFlags UNCHANGEDSINCE = %+v, %v", res, err)
	}
	m2 := res.Changed[0].ModSeq
	if m2 <= m1 {
		t.Fatalf("MODSEQ did not increase: %d then %d", m1, m2)
	}
	res, err = s.SetFlags(ctx(), inbox.ID, store.FlagChange{UIDs: []uint32{3}, Op: store.FlagsRemove, Flags: []string{"Work"}})
	if err != nil || len(res.Changed) != 1 || !slices.Equal(res.Changed[0].Flags, []string{`\Flagged`}) {
		t.Fatalf("SetFlags remove = %+v, %v", res, err)
	}
	if m := mustMailbox(t, s, u, "INBOX"); m.HighestModSeq != res.Changed[0].ModSeq {
		t.Fatalf("HIGHESTMODSEQ = %d, want %d", m.HighestModSeq, res.Changed[0].ModSeq)
	}
	changes, _ := s.Changes(ctx(), inbox.ID, m1, 100)
	if len(changes) != 1 || changes[0].UID != 3 || changes[0].Kind != store.ChangeFlags {
		t.Fatalf("Changes since %d = %+v", m1, changes)
	}
	_, err = s.SetFlags(ctx(), inbox.ID, store.FlagChange{UIDs: []uint32{1}, Op: store.FlagsAdd, Flags: []string{"bad flag"}})
	wantErr(t, "SetFlags with a space", err, store.ErrInvalid)
	_, err = s.SetFlags(ctx(), inbox.ID, store.FlagChange{UIDs: []uint32{1}, Op: store.FlagOp(9), Flags: []string{"X"}})
	wantErr(t, "SetFlags with an unknown operation", err, store.ErrInvalid)
}

func testExpunge(t *testing.T, s store.Store) {
	const u = "ivy@example.test"
	mustUser(t, s, u, 0)
	inbox := mustMailbox(t, s, u, "INBOX")
	msgs := mustAppend(t, s, inbox.ID, "aa\r\n", "bbb\r\n", "cccc\r\n")
	gone, modseq, err := s.Expunge(ctx(), inbox.ID, []uint32{3, 1, 77})
	if err != nil || !slices.Equal(gone, []uint32{1, 3}) || modseq <= msgs[2].ModSeq {
		t.Fatalf("Expunge = %v, %d, %v", gone, modseq, err)
	}
	m := mustMailbox(t, s, u, "INBOX")
	if m.Messages != 1 || m.Size != 5 || m.HighestModSeq != modseq || m.UIDNext != 4 {
		t.Fatalf("mailbox after expunge = %+v", m)
	}
	if us, _ := s.Usage(ctx(), u); us != (store.Usage{Bytes: 5, Messages: 1}) {
		t.Fatalf("usage = %+v", us)
	}
	blobReleased(t, s, msgs[0].Blob, "blob of expunged message")
	changes, _ := s.Changes(ctx(), inbox.ID, msgs[0].ModSeq, 100)
	if len(changes) != 2 || changes[0].Kind != store.ChangeExpunged || changes[1].Kind != store.ChangeExpunged {
		t.Fatalf("Changes after expunge = %+v", changes)
	}
	// Expunged UIDs are never handed out again.
	again := mustAppend(t, s, inbox.ID, "d\r\n")
	if again[0].UID != 4 {
		t.Fatalf("UID after expunge = %d, want 4", again[0].UID)
	}
	if gone, _, err := s.Expunge(ctx(), inbox.ID, []uint32{1}); err != nil || len(gone) != 0 {
		t.Fatalf("second expunge = %v, %v", gone, err)
	}
}

// testChangesWholeModSeq: a page of Changes never ends inside a MODSEQ,
// so a caller paging by the last entry's ModSeq sees every entry of a STORE
// or EXPUNGE that changed more messages than its page holds.
func testChangesWholeModSeq(t *testing.T, s store.Store) {
	const u = "kai@example.test"
	mustUser(t, s, u, 0)
	inbox := mustMailbox(t, s, u, "INBOX")
	first := mustAppend(t, s, inbox.ID, "1\r\n", "2\r\n", "3\r\n", "4\r\n", "5\r\n")
	last := mustAppend(t, s, inbox.ID, "6\r\n")
	page, err := s.Changes(ctx(), inbox.ID, 0, 2)
	if err != nil || len(page) != 5 || page[4].ModSeq != first[0].ModSeq || page[4].UID != 5 {
		t.Fatalf("Changes(0, limit 2) = %+v, %v; want the five entries of MODSEQ %d", page, err, first[0].ModSeq)
	}
	res, err := s.SetFlags(ctx(), inbox.ID, store.FlagChange{UIDs: []uint32{1, 2, 3, 4, 5, 6}, Op: store.FlagsAdd, Flags: []string{`\Seen`}})
	if err != nil || len(res.Changed) != 6 {
		t.Fatalf("SetFlags = %+v, %v", res, err)
	}
	gone, expunged, err := s.Expunge(ctx(), inbox.ID, []uint32{2, 3, 4})
	if err != nil || len(gone) != 3 {
		t.Fatalf("Expunge = %v, %v", gone, err)
	}
	var all []store.Change
	for since := last[0].ModSeq; ; {
		page, err := s.Changes(ctx(), inbox.ID, since, 1)
		if err != nil {
			t.Fatal(err)
		}
		if len(page) == 0 {
			break
		}
		all = append(all, page...)
		since = page[len(page)-1].ModSeq
	}
	want := []store.Change{
		{ModSeq: res.Changed[0].ModSeq, UID: 1, Kind: store.ChangeFlags},
		{ModSeq: res.Changed[0].ModSeq, UID: 5, Kind: store.ChangeFlags},
		{ModSeq: res.Changed[0].ModSeq, UID: 6, Kind: store.ChangeFlags},
		{ModSeq: expunged, UID: 2, Kind: store.ChangeExpunged},
		{ModSeq: expunged, UID: 3, Kind: store.ChangeExpunged},
		{ModSeq: expunged, UID: 4, Kind: store.ChangeExpunged},
	}
	if !slices.Equal(all, want) {
		t.Fatalf("Changes paged by one since %d:\n got %+v\nwant %+v", last[0].ModSeq, all, want)
	}
}

// testListAroundExpunged: ListMessages returns exactly the present
// messages with UID >= from, ascending, at most limit of them, whatever the
// expunged UIDs below, between and above them and however from and limit
// cut the range. Engines may walk the range either way; this pins both.
func testListAroundExpunged(t *testing.T, s store.Store) {
	const u = "lea@example.test"
	mustUser(t, s, u, 0)
	inbox := mustMailbox(t, s, u, "INBOX")
	bodies := make([]string, 20)
	for i := range bodies {
		bodies[i] = fmt.Sprintf("message %d\r\n", i+1)
	}
	mustAppend(t, s, inbox.ID, bodies...)
	gone := []uint32{1, 2, 3, 4, 5, 6, 7, 8, 12, 20}
	if got, _, err := s.Expunge(ctx(), inbox.ID, gone); err != nil || len(got) != len(gone) {
		t.Fatalf("Expunge = %v, %v", got, err)
	}
	var present []uint32
	for uid := uint32(1); uid <= 20; uid++ {
		if !slices.Contains(gone, uid) {
			present = append(present, uid)
		}
	}
	for _, from := range []uint32{0, 1, 8, 9, 10, 12, 13, 19, 20, 21} {
		for _, limit := range []int{0, 1, 3, 8, 9, 10, 1000} {
			var want []uint32
			for _, uid := range present {
				if uid >= from && len(want) < limit {
					want = append(want, uid)
				}
			}
			msgs, err := s.ListMessages(ctx(), inbox.ID, from, limit)
			if err != nil {
				t.Fatalf("ListMessages(%d, %d): %v", from, limit, err)
			}
			var got []uint32
			for _, m := range msgs {
				got = append(got, m.UID)
			}
			if !slices.Equal(got, want) {
				t.Errorf("ListMessages(%d, %d) = %v, want %v", from, limit, got, want)
			}
		}
	}
	if got, _, err := s.Expunge(ctx(), inbox.ID, present); err != nil || len(got) != len(present) {
		t.Fatalf("Expunge the rest = %v, %v", got, err)
	}
	if msgs, err := s.ListMessages(ctx(), inbox.ID, 1, 1000); err != nil || len(msgs) != 0 {
		t.Fatalf("ListMessages of an emptied mailbox = %+v, %v", msgs, err)
	}
}

func testSharedBlob(t *testing.T, s store.Store) {
	mustUser(t, s, "j1@example.test", 0)
	mustUser(t, s, "j2@example.test", 0)
	id, n := mustBlob(t, s, "one body for two recipients\r\n")
	var mboxes []store.ID
	for _, u := range []string{"j1@example.test", "j2@example.test"} {
		m := mustMailbox(t, s, u, "INBOX")
		if _, err := s.Append(ctx(), m.ID, []store.NewMessage{{Blob: id, Size: n}}, store.AppendOptions{}); err != nil {
			t.Fatal(err)
		}
		mboxes = append(mboxes, m.ID)
	}
	if _, _, err := s.Expunge(ctx(), mboxes[0], []uint32{1}); err != nil {
		t.Fatal(err)
	}
	r, err := s.OpenBlob(ctx(), id)
	if err != nil {
		t.Fatalf("blob gone while still referenced: %v", err)
	}
	r.Close()
	if _, _, err := s.Expunge(ctx(), mboxes[1], []uint32{1}); err != nil {
		t.Fatal(err)
	}
	blobReleased(t, s, id, "blob after last reference")
}

// An inline body becomes a blob of its own, read back like any other,
// released by expunge, and independent of the caller's buffer.
func testInlineBody(t *testing.T, s store.Store) {
	const u = "kim@example.test"
	mustUser(t, s, u, 0)
	inbox := mustMailbox(t, s, u, "INBOX")
	large := bytes.Repeat([]byte("0123456789abcdef"), 40_000) // several chunks in any engine
	bodies := [][]byte{[]byte("inline\r\n"), {}, large}
	shared, n := mustBlob(t, s, "stored first\r\n")
	var msgs []store.NewMessage
	for _, b := range bodies {
		msgs = append(msgs, store.NewMessage{Body: bytes.Clone(b), Size: int64(len(b)), InternalDate: time.Now()})
	}
	msgs = append(msgs, store.NewMessage{Blob: shared, Size: n, InternalDate: time.Now()})

	bad := []store.NewMessage{
		{Body: []byte("x"), Blob: shared, Size: 1},
		{Body: []byte("xy"), Size: 1},
		{Size: 1},
	}
	for i, nm := range bad {
		_, err := s.Append(ctx(), inbox.ID, []store.NewMessage{msgs[0], nm}, store.AppendOptions{})
		wantErr(t, fmt.Sprintf("invalid message %d", i), err, store.ErrInvalid)
	}
	if m := mustMailbox(t, s, u, "INBOX"); m.Messages != 0 {
		t.Fatalf("refused appends left %d messages", m.Messages)
	}

	out, err := s.Append(ctx(), inbox.ID, msgs, store.AppendOptions{})
	if err != nil {
		t.Fatalf("Append: %v", err)
	}
	for _, nm := range msgs {
		for i := range nm.Body {
			nm.Body[i] = 'X' // the engine must not have kept the caller's buffer
		}
	}
	seen := map[store.ID]bool{}
	for i, b := range bodies {
		m := out[i]
		if m.Blob.IsZero() || seen[m.Blob] || m.Blob == shared || m.Size != int64(len(b)) {
			t.Fatalf("inline message %d stored as %+v", i, m)
		}
		seen[m.Blob] = true
		r, err := s.OpenBlob(ctx(), m.Blob)
		if err != nil {
			t.Fatalf("OpenBlob of inline body %d: %v", i, err)
		}
		got, err := io.ReadAll(r)
		r.Close()
		if err != nil || !bytes.Equal(got, b) {
			t.Fatalf("inline body %d read back as %d octets (%v), want %d", i, len(got), err, len(b))
		}
	}
	if out[3].Blob != shared {
		t.Fatalf("stored blob replaced: %+v", out[3])
	}
	var total int64
	for _, b := range bodies {
		total += int64(len(b))
	}
	if us, _ := s.Usage(ctx(), u); us != (store.Usage{Bytes: total + n, Messages: 4}) {
		t.Fatalf("usage = %+v, want %d octets in 4 messages", us, total+n)
	}
	if _, _, err := s.Expunge(ctx(), inbox.ID, []uint32{out[0].UID, out[2].UID}); err != nil {
		t.Fatal(err)
	}
	for _, i := range []int{0, 2} {
		blobReleased(t, s, out[i].Blob, "inline blob after expunge")
	}
}

func testDeleteUser(t *testing.T, s store.Store) {
	const u = "kim@example.test"
	mustUser(t, s, u, 0)
	mustUser(t, s, "other@example.test", 0)
	if err := s.CreateAlias(ctx(), "k@example.test", u); err != nil {
		t.Fatal(err)
	}
	inbox := mustMailbox(t, s, u, "INBOX")
	msgs := mustAppend(t, s, inbox.ID, "x\r\n")
	if err := s.DeleteUser(ctx(), u); err != nil {
		t.Fatal(err)
	}
	_, err := s.GetUser(ctx(), u)
	wantErr(t, "GetUser(deleted)", err, store.ErrNotFound)
	_, err = s.Resolve(ctx(), "k@example.test")
	wantErr(t, "alias of deleted user", err, store.ErrNotFound)
	_, err = s.OpenBlob(ctx(), msgs[0].Blob)
	wantErr(t, "blob of deleted user", err, store.ErrNotFound)
	_, err = s.GetMailbox(ctx(), u, "INBOX")
	wantErr(t, "INBOX of deleted user", err, store.ErrNotFound)
	wantErr(t, "DeleteUser twice", s.DeleteUser(ctx(), u), store.ErrNotFound)
	mustUser(t, s, u, 0)
	if m := mustMailbox(t, s, u, "INBOX"); m.Messages != 0 || m.UIDValidity == inbox.UIDValidity {
		t.Fatalf("re-created user's INBOX = %+v (old UIDVALIDITY %d)", m, inbox.UIDValidity)
	}
}

// testConcurrentAppend appends from many goroutines while readers watch:
// UIDs must be unique, and no reader may ever see a UID appear
// below one it has already seen (UIDs increase in observation order).
func testConcurrentAppend(t *testing.T, s store.Store) {
	const u = "lee@example.test"
	const writers, each = 8, 25
	mustUser(t, s, u, 0)
	inbox := mustMailbox(t, s, u, "INBOX")
	var wg sync.WaitGroup
	stop := make(chan struct{})
	errs := make(chan error, writers+2)
	for r := 0; r < 2; r++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			seen := map[uint32]bool{}
			var max uint32
			for {
				select {
				case <-stop:
					return
				default:
				}
				msgs, err := s.ListMessages(ctx(), inbox.ID, 1, 1<<20)
				if err != nil {
					errs <- err
					return
				}
				for _, m := range msgs {
					if !seen[m.UID] && m.UID < max {
						errs <- fmt.Errorf("reader saw UID %d appear after UID %d", m.UID, max)
						return
					}
					seen[m.UID] = true
					if m.UID > max {
						max = m.UID
					}
				}
			}
		}()
	}
	var ww sync.WaitGroup
	for w := 0; w < writers; w++ {
		ww.Add(1)
		go func(w int) {
			defer ww.Done()
			for i := 0; i < each; i++ {
				id, n, err := s.PutBlob(ctx(), strings.NewReader(fmt.Sprintf("w%d m%d\r\n", w, i)), 0)
				if err == nil {
					_, err = s.Append(ctx(), inbox.ID, []store.NewMessage{{Blob: id, Size: n}}, store.AppendOptions{})
				}
				if err != nil {
					errs <- err
					return
				}
			}
		}(w)
	}
	ww.Wait()
	close(stop)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	msgs, err := s.ListMessages(ctx(), inbox.ID, 1, 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	if len(msgs) != writers*each {
		t.Fatalf("%d messages, want %d", len(msgs), writers*each)
	}
	for i, m := range msgs {
		if i > 0 && m.UID <= msgs[i-1].UID {
			t.Fatalf("UID %d listed after UID %d", m.UID, msgs[i-1].UID)
		}
		if i > 0 && m.ModSeq <= msgs[i-1].ModSeq {
			t.Fatalf("MODSEQ not increasing with UID at %d", m.UID)
		}
	}
}

// ExpungeFloor is the conformance test of a change log that forgets old
// expunges. s's engine must keep window MODSEQs of expunges (an engine
// option), and entries must count every change log entry the engine still
// holds for a mailbox. It runs POP3's pattern (deliver, then expunge) 100
// times through a mailbox that also keeps one flagged message, and checks
// that:
//   - the log stays within 2·window entries plus the mailbox's messages;
//   - the floor rose and trails HIGHESTMODSEQ by less than 2·window;
//   - Changes from below the floor fails with ErrExpungesForgotten, never
//     a partial log;
//   - Changes from the floor reports every expunge above it at its MODSEQ;
//   - the message below the floor is still listed, and Check is clean.
//
// It returns the mailbox as it ends; the caller closes s.
func ExpungeFloor(t *testing.T, s store.Store, window uint64, entries func(mailbox store.ID) int) store.Mailbox {
	t.Helper()
	mustUser(t, s, "floor@example.test", 0)
	inbox := mustMailbox(t, s, "floor@example.test", "INBOX")
	kept := mustAppend(t, s, inbox.ID, "kept\r\n")[0]
	if _, err := s.SetFlags(ctx(), inbox.ID, store.FlagChange{UIDs: []uint32{kept.UID}, Op: store.FlagsAdd, Flags: []string{store.FlagSeen}}); err != nil {
		t.Fatal(err)
	}
	expungedAt := map[uint32]uint64{}
	for i := range 100 {
		m := mustAppend(t, s, inbox.ID, "churn\r\n")[0]
		gone, modseq, err := s.Expunge(ctx(), inbox.ID, []uint32{m.UID})
		if err != nil || len(gone) != 1 {
			t.Fatalf("round %d: expunge = %v, %v", i, gone, err)
		}
		expungedAt[m.UID] = modseq
		if n := entries(inbox.ID); n > int(2*window)+1 {
			t.Fatalf("round %d: %d change log entries kept, want at most %d", i, n, 2*window+1)
		}
	}
	mb, err := s.GetMailboxByID(ctx(), inbox.ID)
	if err != nil {
		t.Fatal(err)
	}
	if mb.ExpungeFloor == 0 || mb.ExpungeFloor+2*window <= mb.HighestModSeq {
		t.Fatalf("floor %d with highest modseq %d, window %d", mb.ExpungeFloor, mb.HighestModSeq, window)
	}
	if _, err := s.Changes(ctx(), inbox.ID, mb.ExpungeFloor-1, 1000); !errors.Is(err, store.ErrExpungesForgotten) {
		t.Fatalf("changes since %d below the floor %d: %v, want ErrExpungesForgotten", mb.ExpungeFloor-1, mb.ExpungeFloor, err)
	}
	changes, err := s.Changes(ctx(), inbox.ID, mb.ExpungeFloor, 1000)
	if err != nil {
		t.Fatal(err)
	}
	reported := map[uint32]uint64{}
	for _, c := range changes {
		if c.Kind == store.ChangeExpunged {
			reported[c.UID] = c.ModSeq
		}
	}
	for uid, ms := range expungedAt {
		if got, ok := reported[uid]; ms > mb.ExpungeFloor && (!ok || got != ms) {
			t.Errorf("uid %d expunged at %d above the floor %d: reported %v at %d", uid, ms, mb.ExpungeFloor, ok, got)
		}
	}
	msgs, err := s.ListMessages(ctx(), inbox.ID, 1, 10)
	if err != nil || len(msgs) != 1 || msgs[0].UID != kept.UID || msgs[0].ModSeq > mb.ExpungeFloor {
		t.Fatalf("messages = %+v, %v; want UID %d below the floor", msgs, err, kept.UID)
	}
	problems, err := s.Check(ctx())
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Error(p)
	}
	return mb
}

// testMaildropLease: one lease per maildrop at a time, taken by exactly one
// of many racing sessions, independent between users, and free again once
// released (store.MaildropLocker).
func testMaildropLease(t *testing.T, s store.Store) {
	const user, other = "pop@example.test", "other@example.test"
	const racers = 8
	leases := make([]store.MaildropLease, racers)
	errs := make([]error, racers)
	var wg sync.WaitGroup
	for i := range racers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			leases[i], errs[i] = s.LockMaildrop(ctx(), user)
		}()
	}
	wg.Wait()
	var held store.MaildropLease
	for i, err := range errs {
		switch {
		case err == nil && held == nil:
			held = leases[i]
		case err == nil:
			t.Fatalf("two sessions hold the maildrop of %s at once", user)
		case !errors.Is(err, store.ErrInUse):
			t.Fatalf("racing LockMaildrop: %v, want nil or ErrInUse", err)
		}
	}
	if held == nil {
		t.Fatalf("none of %d racing sessions took the maildrop lease", racers)
	}
	if err := held.Held(); err != nil {
		t.Fatalf("Held of a fresh lease: %v", err)
	}
	_, err := s.LockMaildrop(ctx(), user)
	wantErr(t, "LockMaildrop of a held maildrop", err, store.ErrInUse)

	o, err := s.LockMaildrop(ctx(), other)
	if err != nil {
		t.Fatalf("LockMaildrop of another user: %v", err)
	}
	if err := o.Release(ctx()); err != nil {
		t.Fatalf("Release: %v", err)
	}

	if err := held.Release(ctx()); err != nil {
		t.Fatalf("Release: %v", err)
	}
	if err := held.Release(ctx()); err != nil {
		t.Fatalf("second Release: %v", err)
	}
	if held.Held() == nil {
		t.Fatalf("Held of a released lease: nil, want ErrLeaseLost")
	}
	again, err := s.LockMaildrop(ctx(), user)
	if err != nil {
		t.Fatalf("LockMaildrop after Release: %v", err)
	}
	if err := again.Release(ctx()); err != nil {
		t.Fatalf("Release: %v", err)
	}
}

// testSecrets checks store.Secrets, which every engine implements: a name
// is written once; of concurrent creators exactly one wins and every
// reader then sees its value; names and values are bounded.
func testSecrets(t *testing.T, s store.Store) {
	sec, ok := beneath(s).(store.Secrets)
	if !ok {
		t.Fatalf("%T does not implement store.Secrets", s)
	}
	_, err := sec.GetSecret(ctx(), "cluster/none")
	wantErr(t, "GetSecret of a missing name", err, store.ErrNotFound)

	first := []byte("first value")
	if err := sec.CreateSecret(ctx(), "cluster/a", first); err != nil {
		t.Fatalf("CreateSecret: %v", err)
	}
	first[0] = 'X' // the store keeps its own copy
	wantErr(t, "CreateSecret of an existing name", sec.CreateSecret(ctx(), "cluster/a", []byte("second")), store.ErrExists)
	if got, err := sec.GetSecret(ctx(), "cluster/a"); err != nil || string(got) != "first value" {
		t.Fatalf("GetSecret = %q, %v; want the first value", got, err)
	}

	for _, bad := range []struct {
		name  string
		value []byte
	}{
		{"", []byte("v")},
		{strings.Repeat("n", store.MaxSecretName+1), []byte("v")},
		{"with space", []byte("v")},
		{"nul\x00", []byte("v")},
		{"cluster/empty", []byte{}},
		{"cluster/huge", make([]byte, store.MaxSecretBytes+1)},
	} {
		wantErr(t, fmt.Sprintf("CreateSecret(%q, %d bytes)", bad.name, len(bad.value)), sec.CreateSecret(ctx(), bad.name, bad.value), store.ErrInvalid)
	}
	if err := sec.CreateSecret(ctx(), "cluster/big", make([]byte, store.MaxSecretBytes)); err != nil {
		t.Fatalf("CreateSecret of MaxSecretBytes: %v", err)
	}

	// Concurrent creators: exactly one wins, and its value is the one read.
	winners := race(t, 8, func(i int) error {
		return sec.CreateSecret(ctx(), "cluster/race", []byte(fmt.Sprintf("racer %d", i)))
	})
	if len(winners) != 1 {
		t.Fatalf("%d concurrent CreateSecret calls succeeded (%v), want exactly 1", len(winners), winners)
	}
	got, err := sec.GetSecret(ctx(), "cluster/race")
	if want := fmt.Sprintf("racer %d", winners[0]); err != nil || string(got) != want {
		t.Fatalf("GetSecret after the race = %q, %v; want the winner's %q", got, err, want)
	}
}

// beneath returns the engine under s when s is a user manager over one
// (usermgr.Manager.Unwrap): the contracts beside Store (Secrets,
// Ownership) are the engine's, which the manager does not pass through.
func beneath(s store.Store) any {
	if u, ok := s.(interface{ Unwrap() store.Engine }); ok {
		return u.Unwrap()
	}
	return s
}

// testOwnership checks store.Ownership, which every engine implements:
// each epoch's map is stored once, by exactly one of concurrent
// proposers, and read back as proposed; the latest is the highest epoch;
// lease rows are each node's last write.
func testOwnership(t *testing.T, s store.Store) {
	own, ok := beneath(s).(store.Ownership)
	if !ok {
		t.Fatalf("%T does not implement store.Ownership", s)
	}
	_, err := own.LatestClusterMap(ctx())
	wantErr(t, "LatestClusterMap of an empty store", err, store.ErrNotFound)
	_, err = own.ClusterMapAt(ctx(), 1)
	wantErr(t, "ClusterMapAt(1) of an empty store", err, store.ErrNotFound)

	one := store.ClusterMap{Epoch: 1, Members: []store.MapMember{{ID: "node-a", Weight: 100}}}
	if err := own.ProposeClusterMap(ctx(), one); err != nil {
		t.Fatalf("ProposeClusterMap(1): %v", err)
	}
	other := store.ClusterMap{Epoch: 1, Members: []store.MapMember{{ID: "node-b", Weight: 100}}}
	wantErr(t, "ProposeClusterMap of a taken epoch", own.ProposeClusterMap(ctx(), other), store.ErrExists)
	two := store.ClusterMap{Epoch: 2, Members: []store.MapMember{
		{ID: "node-a", Weight: 100}, {ID: "node-b", Weight: 50, Draining: true}}}
	if err := own.ProposeClusterMap(ctx(), two); err != nil {
		t.Fatalf("ProposeClusterMap(2): %v", err)
	}
	sameMap := func(what string, got store.ClusterMap, err error, want store.ClusterMap) {
		t.Helper()
		if err != nil || got.Epoch != want.Epoch || !slices.Equal(got.Members, want.Members) {
			t.Fatalf("%s = %+v, %v; want %+v", what, got, err, want)
		}
	}
	got, err := own.LatestClusterMap(ctx())
	sameMap("LatestClusterMap", got, err, two)
	got, err = own.ClusterMapAt(ctx(), 1)
	sameMap("ClusterMapAt(1)", got, err, one)
	got.Members[0].ID = "changed" // the caller's copy
	got, err = own.ClusterMapAt(ctx(), 1)
	sameMap("ClusterMapAt(1) after changing a copy", got, err, one)

	for _, bad := range []store.ClusterMap{
		{Epoch: 0, Members: one.Members},
		{Epoch: store.MaxEpoch, Members: one.Members},
		{Epoch: 3},
		{Epoch: 3, Members: []store.MapMember{{ID: ""}}},
		{Epoch: 3, Members: []store.MapMember{{ID: "with space"}}},
		{Epoch: 3, Members: []store.MapMember{{ID: "a"}, {ID: "a"}}},
	} {
		wantErr(t, fmt.Sprintf("ProposeClusterMap(%+v)", bad), own.ProposeClusterMap(ctx(), bad), store.ErrInvalid)
	}

	// Concurrent proposers of one epoch: exactly one wins, and its map is
	// the one read.
	winners := race(t, 6, func(i int) error {
		m := store.ClusterMap{Epoch: 3, Members: []store.MapMember{{ID: fmt.Sprintf("racer-%d", i), Weight: 1}}}
		return own.ProposeClusterMap(ctx(), m)
	})
	if len(winners) != 1 {
		t.Fatalf("%d concurrent proposals of epoch 3 succeeded (%v), want exactly 1", len(winners), winners)
	}
	got, err = own.LatestClusterMap(ctx())
	if want := fmt.Sprintf("racer-%d", winners[0]); err != nil || got.Epoch != 3 || len(got.Members) != 1 || got.Members[0].ID != want {
		t.Fatalf("LatestClusterMap after the race = %+v, %v; want epoch 3 of %s", got, err, want)
	}

	// Pruning forgets the epochs below the bound and nothing else.
	if err := own.PruneClusterMaps(ctx(), 3); err != nil {
		t.Fatalf("PruneClusterMaps(3): %v", err)
	}
	for _, e := range []uint64{1, 2} {
		_, err = own.ClusterMapAt(ctx(), e)
		wantErr(t, fmt.Sprintf("ClusterMapAt(%d) after pruning below 3", e), err, store.ErrNotFound)
	}
	if got, err := own.LatestClusterMap(ctx()); err != nil || got.Epoch != 3 {
		t.Fatalf("LatestClusterMap after pruning = %+v, %v", got, err)
	}
	if got, err := own.ClusterMapAt(ctx(), 3); err != nil || got.Epoch != 3 {
		t.Fatalf("ClusterMapAt(3) after pruning = %+v, %v", got, err)
	}

	// Leases: each node's last write.
	if ls, err := own.NodeLeases(ctx()); err != nil || len(ls) != 0 {
		t.Fatalf("NodeLeases of no node = %v, %v", ls, err)
	}
	for i, l := range []store.NodeLease{
		{Node: "node-a", Adopted: 1, Renewal: 10},
		{Node: "node-b", Adopted: 2, Renewal: 7},
		{Node: "node-a", Adopted: 2, Renewal: 11},
		{Node: "node-b", Adopted: 2, Renewal: 8, Released: true},
	} {
		if err := own.PutNodeLease(ctx(), l); err != nil {
			t.Fatalf("PutNodeLease #%d: %v", i, err)
		}
	}
	ls, err := own.NodeLeases(ctx())
	if err != nil {
		t.Fatal(err)
	}
	slices.SortFunc(ls, func(a, b store.NodeLease) int { return strings.Compare(a.Node, b.Node) })
	want := []store.NodeLease{{Node: "node-a", Adopted: 2, Renewal: 11}, {Node: "node-b", Adopted: 2, Renewal: 8, Released: true}}
	if !slices.Equal(ls, want) {
		t.Fatalf("NodeLeases = %+v, want %+v", ls, want)
	}
	wantErr(t, "PutNodeLease without a node", own.PutNodeLease(ctx(), store.NodeLease{Adopted: 1}), store.ErrInvalid)
}

// race runs n calls of create at once and returns the indexes of those
// that succeeded; a failure other than store.ErrExists fails the test.
func race(t *testing.T, n int, create func(i int) error) []int {
	t.Helper()
	var (
		wg      sync.WaitGroup
		mu      sync.Mutex
		winners []int
	)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			switch err := create(i); {
			case err == nil:
				mu.Lock()
				winners = append(winners, i)
				mu.Unlock()
			case !errors.Is(err, store.ErrExists):
				t.Errorf("racer %d: %v", i, err)
			}
		}()
	}
	wg.Wait()
	return winners
}

// UserInbox creates the user addr in s and returns its INBOX: the start of
// most engine tests.
func UserInbox(t testing.TB, s store.Engine, addr string) store.Mailbox {
	t.Helper()
	if err := s.CreateUser(ctx(), store.User{Address: addr}); err != nil {
		t.Fatal(err)
	}
	inbox, err := s.GetMailbox(ctx(), addr, "INBOX")
	if err != nil {
		t.Fatal(err)
	}
	return inbox
}
