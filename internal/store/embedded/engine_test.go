package embedded

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2"
	dto "github.com/prometheus/client_model/go"

	"quill/internal/store"
	"quill/internal/store/storetest"
	"quill/internal/usermgr"
)

// The conformance suite, with the mailbox writes built by the user
// manager and applied by the engine as batches (ADR 0023).
func TestConformance(t *testing.T) {
	storetest.Run(t, func(t *testing.T) store.Store {
		e, err := Open(t.TempDir(), Options{})
		if err != nil {
			t.Fatal(err)
		}
		return writer(e)
	})
}

// writers are the user managers the tests write mailboxes through, one per
// engine: the engine applies batches, the manager builds them.
var writers sync.Map // *Engine -> *usermgr.Manager

func writer(e *Engine) *usermgr.Manager {
	if w, ok := writers.Load(e); ok {
		return w.(*usermgr.Manager)
	}
	w, _ := writers.LoadOrStore(e, usermgr.New(e, usermgr.Options{}))
	return w.(*usermgr.Manager)
}

func open(t testing.TB, dir string) *Engine {
	t.Helper()
	e, err := Open(dir, Options{})
	if err != nil {
		t.Fatal(err)
	}
	return e
}

func appendOne(t testing.TB, e *Engine, mbox store.ID, body string) store.Message {
	t.Helper()
	ctx := context.Background()
	id, n, err := e.PutBlob(ctx, strings.NewReader(body), 0)
	if err != nil {
		t.Fatal(err)
	}
	msgs, err := writer(e).Append(ctx, mbox, []store.NewMessage{{Blob: id, Size: n, InternalDate: time.Now()}}, store.AppendOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return msgs[0]
}

func TestReopenKeepsEverything(t *testing.T) {
	dir := t.TempDir()
	ctx := context.Background()
	e := open(t, dir)
	if err := e.CreateUser(ctx, store.User{Address: "a@example.test", PasswordHash: "h"}); err != nil {
		t.Fatal(err)
	}
	inbox, _ := e.GetMailbox(ctx, "a@example.test", "INBOX")
	m := appendOne(t, e, inbox.ID, "persisted body\r\n")
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	e = open(t, dir)
	defer e.Close()
	got, err := e.GetMessage(ctx, inbox.ID, m.UID)
	if err != nil || got.Blob != m.Blob || got.ModSeq != m.ModSeq {
		t.Fatalf("after reopen: %+v, %v", got, err)
	}
	r, err := e.OpenBlob(ctx, m.Blob)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(r)
	if string(b) != "persisted body\r\n" {
		t.Fatalf("body after reopen = %q", b)
	}
	// UIDs continue after a restart; they are never handed out again.
	if next := appendOne(t, e, inbox.ID, "x"); next.UID != m.UID+1 {
		t.Fatalf("UID after reopen = %d, want %d", next.UID, m.UID+1)
	}
	if problems, _ := e.Check(ctx); len(problems) > 0 {
		t.Fatal(problems)
	}
}

func TestUnreferencedBlobReclaimedAtOpen(t *testing.T) {
	dir := t.TempDir()
	ctx := context.Background()
	e := open(t, dir)
	id, _, err := e.PutBlob(ctx, strings.NewReader(strings.Repeat("z", 600<<10)), 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.OpenBlob(ctx, id); err != nil {
		t.Fatalf("fresh blob: %v", err)
	}
	e.Close()
	// As after a crash between storing a body and appending it.
	e = open(t, dir)
	defer e.Close()
	if _, err := e.OpenBlob(ctx, id); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("orphan blob after reopen: %v", err)
	}
	it, _ := e.db.NewIter(&pebble.IterOptions{LowerBound: chunkPrefix(id), UpperBound: prefixEnd(chunkPrefix(id))})
	defer it.Close()
	if it.First() {
		t.Fatal("orphan blob's chunks survived")
	}
}

func TestFenceHidesUnsyncedAppends(t *testing.T) {
	ctx := context.Background()
	e := open(t, t.TempDir())
	defer e.Close()
	inbox := storetest.UserInbox(t, e, "a@example.test")
	first := appendOne(t, e, inbox.ID, "one")
	before, _ := e.GetMailboxByID(ctx, inbox.ID)
	second := appendOne(t, e, inbox.ID, "two")
	// Pretend the second append's group is still being synced.
	e.fenceMu.Lock()
	e.fence[inbox.ID] = before
	e.fenceMu.Unlock()
	if m, _ := e.GetMailboxByID(ctx, inbox.ID); m.UIDNext != before.UIDNext || m.Messages != 1 {
		t.Errorf("fenced mailbox shows %+v", m)
	}
	if msgs, _ := e.ListMessages(ctx, inbox.ID, 1, 10); len(msgs) != 1 || msgs[0].UID != first.UID {
		t.Errorf("fenced ListMessages = %+v", msgs)
	}
	if _, err := e.GetMessage(ctx, inbox.ID, second.UID); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("fenced GetMessage = %v", err)
	}
	if ch, _ := e.Changes(ctx, inbox.ID, 0, 10); len(ch) != 1 {
		t.Errorf("fenced Changes = %+v", ch)
	}
	e.fenceMu.Lock()
	delete(e.fence, inbox.ID)
	e.fenceMu.Unlock()
	if msgs, _ := e.ListMessages(ctx, inbox.ID, 1, 10); len(msgs) != 2 {
		t.Errorf("unfenced ListMessages = %d messages", len(msgs))
	}
}

// TestGroupCommit checks that concurrent appends share fsyncs: the commit
// groups must be fewer than the transactions.
func TestGroupCommit(t *testing.T) {
	ctx := context.Background()
	e := open(t, t.TempDir())
	defer e.Close()
	const users, each = 32, 20
	var ids []store.ID
	for i := 0; i < users; i++ {
		u := fmt.Sprintf("u%d@example.test", i)
		if err := e.CreateUser(ctx, store.User{Address: u}); err != nil {
			t.Fatal(err)
		}
		m, _ := e.GetMailbox(ctx, u, "INBOX")
		ids = append(ids, m.ID)
	}
	groupsBefore := sampleCount(t, e)
	var wg sync.WaitGroup
	for _, id := range ids {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := 0; j < each; j++ {
				appendOne(t, e, id, "m")
			}
		}()
	}
	wg.Wait()
	groups := sampleCount(t, e) - groupsBefore
	if groups >= users*each {
		t.Fatalf("%d appends took %d commit groups: no grouping", users*each, groups)
	}
	t.Logf("%d appends in %d commit groups", users*each, groups)
}

func sampleCount(t *testing.T, e *Engine) uint64 {
	var m dto.Metric
	if err := e.groupSize.Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetHistogram().GetSampleCount()
}

// BenchmarkAppend measures delivery into the store (PutBlob + Append of a
// 4.7 KB body) from parallel goroutines, into many mailboxes and into one
// hot mailbox. Each append is durable (fsync'd, group-committed).
func BenchmarkAppend(b *testing.B) {
	body := strings.Repeat("x", 4700)
	for _, tc := range []struct {
		name      string
		mailboxes int
	}{{"uniform", 256}, {"hot", 1}} {
		b.Run(tc.name, func(b *testing.B) {
			ctx := context.Background()
			e := open(b, b.TempDir())
			defer e.Close()
			var ids []store.ID
			for i := 0; i < tc.mailboxes; i++ {
				u := fmt.Sprintf("u%d@example.test", i)
				if err := e.CreateUser(ctx, store.User{Address: u}); err != nil {
					b.Fatal(err)
				}
				m, _ := e.GetMailbox(ctx, u, "INBOX")
				ids = append(ids, m.ID)
			}
			var n sync.Mutex
			next := 0
			b.SetParallelism(32)
			b.SetBytes(int64(len(body)))
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					n.Lock()
					id := ids[next%len(ids)]
					next++
					n.Unlock()
					blob, size, err := e.PutBlob(ctx, strings.NewReader(body), 0)
					if err != nil {
						b.Fatal(err)
					}
					if _, err := writer(e).Append(ctx, id, []store.NewMessage{{Blob: blob, Size: size}}, store.AppendOptions{}); err != nil {
						b.Fatal(err)
					}
				}
			})
		})
	}
}

// BenchmarkDeliverExpunge is POP3's pattern in one mailbox: a delivery
// with its body, then the expunge of that message, from 32 goroutines.
// Every message leaves an expunge entry, so this is where pruning them
// costs most.
func BenchmarkDeliverExpunge(b *testing.B) {
	ctx := context.Background()
	e := open(b, b.TempDir())
	defer e.Close()
	inbox := storetest.UserInbox(b, e, "hot@example.test")
	body := []byte(strings.Repeat("x", 4700))
	b.SetParallelism(32)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			msgs, err := writer(e).Append(ctx, inbox.ID, []store.NewMessage{{Body: body, Size: int64(len(body))}}, store.AppendOptions{})
			if err != nil {
				b.Fatal(err)
			}
			if _, _, err := writer(e).Expunge(ctx, inbox.ID, []uint32{msgs[0].UID}); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// BenchmarkSyncedCommit is the floor under the committer's cycle: one
// group's worth of writes (five 5,000-byte values, about what a group of
// the Porcupine mix carries) committed with Sync on the engine's own Pebble,
// from one goroutine, with nothing else running. Compare it with
// quill_store_commit_seconds under load (docs/adr/0019-performance-record.md).
func BenchmarkSyncedCommit(b *testing.B) {
	e := open(b, b.TempDir())
	defer e.Close()
	val := make([]byte, 5000)
	b.SetBytes(5 * int64(len(val)))
	b.ResetTimer()
	for i := range b.N {
		bt := e.db.NewBatch()
		for j := range 5 {
			if err := bt.Set(fmt.Appendf(nil, "bench-%d-%d", i, j), val, nil); err != nil {
				b.Fatal(err)
			}
		}
		if err := bt.Commit(pebble.Sync); err != nil {
			b.Fatal(err)
		}
		bt.Close()
	}
}

// BenchmarkListMessages measures listing a 10,000-message mailbox.
func BenchmarkListMessages(b *testing.B) {
	ctx := context.Background()
	e := open(b, b.TempDir())
	defer e.Close()
	if err := e.CreateUser(ctx, store.User{Address: "a@example.test"}); err != nil {
		b.Fatal(err)
	}
	inbox, _ := e.GetMailbox(ctx, "a@example.test", "INBOX")
	blob, size, _ := e.PutBlob(ctx, strings.NewReader("body"), 0)
	batch := make([]store.NewMessage, 1000)
	for i := range batch {
		batch[i] = store.NewMessage{Blob: blob, Size: size, Flags: []string{`\Seen`}}
	}
	for i := 0; i < 10; i++ {
		if _, err := writer(e).Append(ctx, inbox.ID, batch, store.AppendOptions{}); err != nil {
			b.Fatal(err)
		}
	}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		msgs, err := e.ListMessages(ctx, inbox.ID, 1, 20000)
		if err != nil || len(msgs) != 10000 {
			b.Fatal(len(msgs), err)
		}
	}
}

// BenchmarkOpenBlob measures what a retrieval costs the store before the
// body's bytes: finding a body among 50,000 stored ones (its blob record)
// and taking its log segment, from parallel readers, as POP3 RETR and IMAP
// FETCH do.
func BenchmarkOpenBlob(b *testing.B) {
	ctx := context.Background()
	e := open(b, b.TempDir())
	defer e.Close()
	inbox := storetest.UserInbox(b, e, "a@example.test")
	body := []byte(strings.Repeat("x", 4700))
	var blobs []store.ID
	for range 50 {
		batch := make([]store.NewMessage, 1000)
		for i := range batch {
			batch[i] = store.NewMessage{Body: body, Size: int64(len(body))}
		}
		msgs, err := writer(e).Append(ctx, inbox.ID, batch, store.AppendOptions{})
		if err != nil {
			b.Fatal(err)
		}
		for _, m := range msgs {
			blobs = append(blobs, m.Blob)
		}
	}
	var next atomic.Uint64
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		var buf [1]byte
		for pb.Next() {
			r, err := e.OpenBlob(ctx, blobs[next.Add(7919)%uint64(len(blobs))])
			if err != nil {
				b.Fatal(err)
			}
			if _, err := r.ReadAt(buf[:], 0); err != nil {
				b.Fatal(err)
			}
			r.Close()
		}
	})
}

func TestUseAfterClose(t *testing.T) {
	e := open(t, t.TempDir())
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	if err := e.CreateUser(context.Background(), store.User{Address: "a@example.test"}); !errors.Is(err, ErrClosed) {
		t.Fatalf("write after Close: %v, want ErrClosed", err)
	}
	if err := e.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
}

// The committer's hot cache must hold exactly the committed records: the
// writes of a failed transaction never reach it, and after any mix of
// deliveries, expunges and user changes every cached record equals the
// database's.
func TestHotCacheHoldsCommittedRecords(t *testing.T) {
	ctx := context.Background()
	e := open(t, t.TempDir())
	defer e.Close()
	users := []string{"a@example.test", "b@example.test", "c@example.test"}
	for _, u := range users {
		if err := e.CreateUser(ctx, store.User{Address: u}); err != nil {
			t.Fatal(err)
		}
	}
	inbox, _ := e.GetMailbox(ctx, users[0], "INBOX")
	appendOne(t, e, inbox.ID, "one")
	before, _ := e.Usage(ctx, users[0])

	boom := errors.New("boom")
	err := e.update(ctx, func(t *txn) error {
		if err := t.addUsage(users[0], 1000, 1); err != nil {
			return err
		}
		return boom
	})
	if !errors.Is(err, boom) {
		t.Fatalf("update = %v", err)
	}
	var seen store.Usage
	if err := e.update(ctx, func(t *txn) error {
		var err error
		seen, err = t.usage(users[0])
		return err
	}); err != nil {
		t.Fatal(err)
	}
	if seen != before {
		t.Errorf("committer sees usage %+v after a failed transaction, want %+v", seen, before)
	}

	// Concurrent traffic so that groups hold several transactions, then a
	// user deleted and re-created.
	var wg sync.WaitGroup
	for i := range 40 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			u := users[i%len(users)]
			mb, err := e.GetMailbox(ctx, u, "INBOX")
			if err != nil {
				t.Error(err)
				return
			}
			m := appendOne(t, e, mb.ID, fmt.Sprintf("message %d", i))
			if i%3 == 0 {
				if _, _, err := writer(e).Expunge(ctx, mb.ID, []uint32{m.UID}); err != nil {
					t.Error(err)
				}
			}
		}()
	}
	wg.Wait()
	if err := e.DeleteUser(ctx, users[2]); err != nil {
		t.Fatal(err)
	}
	if err := e.CreateUser(ctx, store.User{Address: users[2], QuotaBytes: 1}); err != nil {
		t.Fatal(err)
	}
	// Read through the committer so that it runs strictly after every
	// write above, then compare with the committed state (the overlay
	// over Pebble).
	if err := e.update(ctx, func(*txn) error { return nil }); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	e.reqs <- &request{fn: func(*txn) error {
		for k, v := range e.hot.m {
			got, err := e.read([]byte(k))
			if errors.Is(err, store.ErrNotFound) {
				got = nil
			} else if err != nil {
				t.Error(err)
			}
			if string(got) != string(v) || (got == nil) != (v == nil) {
				t.Errorf("hot cache %q = %x, database %x", k, v, got)
			}
		}
		for id, r := range e.blobs.m {
			v, err := e.read(blobKey(id))
			if err != nil {
				t.Errorf("blob cache holds %s, database: %v", id, err)
				continue
			}
			if got, err := decodeBlob(v); err != nil || got != r {
				t.Errorf("blob cache %s = %+v, database %+v (%v)", id, r, got, err)
			}
		}
		return nil
	}, done: done}
	<-done
	if len(e.hot.m) == 0 || len(e.blobs.m) == 0 {
		t.Errorf("caches hold %d and %d entries after traffic", len(e.hot.m), len(e.blobs.m))
	}
}

func TestHotCacheBounded(t *testing.T) {
	c := newHotCache(2)
	for _, k := range []string{"ua", "ub", "uc", "ub"} {
		c.put(k, []byte(k))
	}
	if len(c.m) != 2 {
		t.Errorf("cache holds %d entries, want 2", len(c.m))
	}
	if v, ok := c.get([]byte("ub")); !ok || string(v) != "ub" {
		t.Errorf("last written entry missing: %q %v", v, ok)
	}
	c.put("ub", nil)
	if v, ok := c.get([]byte("ub")); !ok || v != nil {
		t.Errorf("deleted entry reads %q %v, want known absent", v, ok)
	}

	b := newBlobCache(2)
	ids := []store.ID{store.NewID(), store.NewID(), store.NewID()}
	for i, id := range append(ids, ids[1]) {
		b.put(id, encodeBlob(blobRecord{Size: int64(i), Refs: 1, Seg: 7, Off: 9}))
	}
	if len(b.m) != 2 {
		t.Errorf("blob cache holds %d entries, want 2", len(b.m))
	}
	if r, ok := b.get(ids[1]); !ok || r != (blobRecord{Size: 3, Refs: 1, Seg: 7, Off: 9}) {
		t.Errorf("last written blob record: %+v %v", r, ok)
	}
	b.put(ids[1], nil)
	if _, ok := b.get(ids[1]); ok {
		t.Error("blob cache keeps a deleted record")
	}
}

// Readers served from the hot cache must never see a mailbox record older
// than messages they have already listed, nor one going backwards, while
// groups commit under them.
func TestHotCacheReadersSeeNoOlderRecord(t *testing.T) {
	ctx := context.Background()
	e := open(t, t.TempDir())
	defer e.Close()
	inbox := storetest.UserInbox(t, e, "a@example.test")
	stop := make(chan struct{})
	var writers sync.WaitGroup
	for w := range 4 {
		writers.Add(1)
		go func() {
			defer writers.Done()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				m := appendOne(t, e, inbox.ID, fmt.Sprintf("w%d m%d", w, i))
				if i%4 == 0 {
					if _, _, err := writer(e).Expunge(ctx, inbox.ID, []uint32{m.UID}); err != nil {
						t.Error(err)
						return
					}
				}
			}
		}()
	}
	var last uint32
	for range 300 {
		m1, err := e.GetMailboxByID(ctx, inbox.ID)
		if err != nil {
			t.Fatal(err)
		}
		msgs, err := e.ListMessages(ctx, inbox.ID, 1, 1<<20)
		if err != nil {
			t.Fatal(err)
		}
		m2, err := e.GetMailboxByID(ctx, inbox.ID)
		if err != nil {
			t.Fatal(err)
		}
		if m1.UIDNext < last || m2.UIDNext < m1.UIDNext {
			t.Fatalf("UIDNEXT went backwards: %d, then %d, then %d", last, m1.UIDNext, m2.UIDNext)
		}
		last = m2.UIDNext
		if n := len(msgs); n > 0 && msgs[n-1].UID >= m2.UIDNext {
			t.Fatalf("listed UID %d, then read UIDNEXT %d", msgs[n-1].UID, m2.UIDNext)
		}
	}
	close(stop)
	writers.Wait()
}

// GetMailbox's INBOX hints are only hints: a user deleted, or deleted and
// re-created, and a hint naming some other mailbox all get the INBOX the
// name record names.
func TestInboxHints(t *testing.T) {
	ctx := context.Background()
	e := open(t, t.TempDir())
	defer e.Close()
	old := storetest.UserInbox(t, e, "a@example.test")
	if id, ok := e.inboxes.Get("a@example.test"); !ok || id != old.ID {
		t.Fatalf("hint after GetMailbox = %v %v, want %v", id, ok, old.ID)
	}
	if err := e.DeleteUser(ctx, "a@example.test"); err != nil {
		t.Fatal(err)
	}
	if _, err := e.GetMailbox(ctx, "a@example.test", "INBOX"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("INBOX of a deleted user: %v, want ErrNotFound", err)
	}
	if err := e.CreateUser(ctx, store.User{Address: "a@example.test"}); err != nil {
		t.Fatal(err)
	}
	e.inboxes.Put("a@example.test", old.ID)
	got, err := e.GetMailbox(ctx, "a@example.test", "inbox")
	if err != nil || got.ID == old.ID || got.Name != "INBOX" || got.User != "a@example.test" {
		t.Fatalf("INBOX of the re-created user = %+v, %v; want a new one", got, err)
	}
	other := storetest.UserInbox(t, e, "b@example.test")
	sent, err := e.CreateMailbox(ctx, "a@example.test", "Sent", store.MailboxOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, wrong := range []store.ID{other.ID, sent.ID} {
		e.inboxes.Put("a@example.test", wrong)
		if m, err := e.GetMailbox(ctx, "a@example.test", "INBOX"); err != nil || m.ID != got.ID {
			t.Fatalf("with a hint naming %v: %+v, %v; want %v", wrong, m, err, got.ID)
		}
	}
}

// GetUser's memo spares decoding a record the hot cache still holds (a
// hit allocates nothing), and never answers for a record that has changed since, even one that changed
// to bytes of the same length.
func TestGetUserMemo(t *testing.T) {
	ctx := context.Background()
	e := open(t, t.TempDir())
	defer e.Close()
	const addr = "a@example.test"
	storetest.UserInbox(t, e, addr)
	update := func(quota int64) {
		t.Helper()
		if err := e.UpdateUser(ctx, store.User{Address: addr, PasswordHash: "h", QuotaBytes: quota}); err != nil {
			t.Fatal(err)
		}
	}
	get := func() store.User {
		t.Helper()
		u, err := e.GetUser(ctx, addr)
		if err != nil {
			t.Fatal(err)
		}
		return u
	}
	update(10) // UpdateUser's transaction puts the record in the hot cache
	if u := get(); u.QuotaBytes != 10 {
		t.Fatalf("quota %d, want 10", u.QuotaBytes)
	}
	d, ok := e.users.load(addr)
	if !ok || d.user.QuotaBytes != 10 {
		t.Fatalf("memo after GetUser: %+v %v", d, ok)
	}
	hit := testing.AllocsPerRun(20, func() { get() })
	miss := testing.AllocsPerRun(1, func() { e.users.reset(); get() })
	if hit != 0 || miss == 0 {
		t.Errorf("GetUser allocates %v times with the memo, %v without; want none with it", hit, miss)
	}
	update(20) // the same length: only the identity tells the values apart
	if u := get(); u.QuotaBytes != 20 {
		t.Fatalf("quota after an update %d, want 20", u.QuotaBytes)
	}
	if err := e.DeleteUser(ctx, addr); err != nil {
		t.Fatal(err)
	}
	if _, err := e.GetUser(ctx, addr); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("GetUser of a deleted user: %v, want ErrNotFound", err)
	}
}
