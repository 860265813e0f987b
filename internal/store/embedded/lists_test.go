package embedded

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"quill/internal/store"
	"quill/internal/store/storetest"
)

// Under concurrent deliveries, flag changes, expunges, summaries kept
// (SetMeta) and mailbox deletions, listCache must hold exactly the
// database's message records of every mailbox it holds, and the listings
// it answers must equal Pebble's.
func TestListCacheMatchesDatabase(t *testing.T) {
	ctx := context.Background()
	e := open(t, t.TempDir())
	defer e.Close()
	var inboxes []store.Mailbox
	for i := range 6 {
		inboxes = append(inboxes, storetest.UserInbox(t, e, fmt.Sprintf("u%d@example.test", i)))
	}
	var wg sync.WaitGroup
	for w := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			mb := inboxes[w%len(inboxes)].ID
			for i := range 60 {
				body := []byte(fmt.Sprintf("w%d m%d", w, i))
				msgs, err := writer(e).Append(ctx, mb, []store.NewMessage{{Body: body, Size: int64(len(body))}, {Body: body, Size: int64(len(body))}}, store.AppendOptions{})
				if err != nil {
					t.Error(err)
					return
				}
				switch i % 4 {
				case 0:
					_, _, err = writer(e).Expunge(ctx, mb, []uint32{msgs[0].UID, msgs[1].UID})
				case 1:
					_, err = writer(e).SetFlags(ctx, mb, store.FlagChange{UIDs: []uint32{msgs[1].UID}, Op: store.FlagsAdd, Flags: []string{`\Seen`}})
				case 2:
					all, lerr := e.ListMessages(ctx, mb, 1, 1<<20)
					if lerr != nil {
						t.Error(lerr)
						return
					}
					var uids []uint32
					for _, m := range all {
						uids = append(uids, m.UID)
					}
					_, _, err = writer(e).Expunge(ctx, mb, uids)
				case 3:
					err = e.SetMeta(ctx, mb, map[uint32][]byte{msgs[0].UID: []byte("summary")})
				}
				if err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	// A mailbox created, filled and deleted alongside.
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := range 20 {
			name := fmt.Sprintf("tmp%d", i)
			mb, err := e.CreateMailbox(ctx, "u0@example.test", name, store.MailboxOptions{})
			if err != nil {
				t.Error(err)
				return
			}
			appendOne(t, e, mb.ID, "short-lived")
			if err := e.DeleteMailbox(ctx, "u0@example.test", name); err != nil {
				t.Error(err)
				return
			}
			if msgs, err := e.ListMessages(ctx, mb.ID, 1, 10); err != nil || len(msgs) != 0 {
				t.Errorf("deleted mailbox lists %d messages, %v", len(msgs), err)
			}
		}
	}()
	wg.Wait()
	if len(e.lists.m) == 0 {
		t.Fatal("the list cache holds no mailbox after the traffic")
	}
	checkClean(t, e)
	// Each cached listing against Pebble's.
	for _, mb := range inboxes {
		cached, err := e.ListMessages(ctx, mb.ID, 1, 1<<20)
		if err != nil {
			t.Fatal(err)
		}
		e.lists.drop(mb.ID)
		stored, err := e.ListMessages(ctx, mb.ID, 1, 1<<20)
		if err != nil {
			t.Fatal(err)
		}
		if fmt.Sprint(cached) != fmt.Sprint(stored) {
			t.Errorf("mailbox %s: cache lists %v, database %v", mb.ID, cached, stored)
		}
	}
}

// A failed transaction's message writes never reach listCache, and the
// transactions after it in the group read the committed records.
func TestListCacheSkipsFailedTransactions(t *testing.T) {
	ctx := context.Background()
	e := open(t, t.TempDir())
	defer e.Close()
	inbox := storetest.UserInbox(t, e, "a@example.test")
	m := appendOne(t, e, inbox.ID, "one")
	if _, ok := e.lists.get(inbox.ID, m.UID); !ok {
		t.Fatal("a first delivery into an empty mailbox is not cached")
	}
	boom := errors.New("boom")
	err := e.update(ctx, func(t *txn) error {
		t.del(messageKey(inbox.ID, m.UID))
		t.set(messageKey(inbox.ID, m.UID+1), encodeMessage(store.Message{Size: 1}))
		return boom
	})
	if !errors.Is(err, boom) {
		t.Fatalf("update = %v", err)
	}
	msgs, err := e.ListMessages(ctx, inbox.ID, 1, 10)
	if err != nil || len(msgs) != 1 || msgs[0].UID != m.UID {
		t.Fatalf("after a failed transaction: %v, %v", msgs, err)
	}
	if _, err := e.GetMessage(ctx, inbox.ID, m.UID+1); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("a failed transaction's message reads back: %v", err)
	}
	checkClean(t, e)
}

// holdCommitter blocks the committer until the returned function is
// called, once the n requests queued after it are waiting, so that they
// commit as one group.
func holdCommitter(t *testing.T, e *Engine, n int) (release func()) {
	t.Helper()
	gate, running := make(chan struct{}), make(chan struct{})
	go func() {
		_ = e.update(context.Background(), func(*txn) error {
			close(running)
			<-gate
			return nil
		})
	}()
	<-running
	return func() {
		for len(e.reqs) < n {
			runtime.Gosched()
		}
		close(gate)
	}
}

// A mailbox created, delivered to and deleted within one group must not
// enter listCache with the records the deletion removed.
func TestListCacheMailboxDeletedInGroup(t *testing.T) {
	ctx := context.Background()
	e := open(t, t.TempDir())
	defer e.Close()
	storetest.UserInbox(t, e, "a@example.test")
	mb, err := e.CreateMailbox(ctx, "a@example.test", "Doomed", store.MailboxOptions{})
	if err != nil {
		t.Fatal(err)
	}
	release := holdCommitter(t, e, 2)
	appended := make(chan error, 1)
	go func() {
		_, err := writer(e).Append(ctx, mb.ID, []store.NewMessage{{Body: []byte("x"), Size: 1}}, store.AppendOptions{})
		appended <- err
	}()
	for len(e.reqs) < 1 {
		runtime.Gosched()
	}
	deleted := make(chan error, 1)
	go func() { deleted <- e.DeleteMailbox(ctx, "a@example.test", "Doomed") }()
	release()
	if err := <-appended; err != nil {
		t.Fatal(err)
	}
	if err := <-deleted; err != nil {
		t.Fatal(err)
	}
	if l := e.lists.m[mb.ID]; l != nil {
		t.Errorf("deleted mailbox cached with UIDs %v", l.uids)
	}
	checkClean(t, e)
}

// The cache keeps to its byte budget and drops mailboxes beyond
// listMaxLen, and what it keeps stays exact.
func TestListCacheBounded(t *testing.T) {
	ctx := context.Background()
	e, err := Open(t.TempDir(), Options{ListCacheBytes: 4 << 10})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	for i := range 40 {
		inbox := storetest.UserInbox(t, e, fmt.Sprintf("u%d@example.test", i))
		appendOne(t, e, inbox.ID, "message")
		if e.lists.bytes > e.lists.max {
			t.Fatalf("cache holds %d bytes, budget %d", e.lists.bytes, e.lists.max)
		}
	}
	if n := len(e.lists.m); n == 0 || n == 40 {
		t.Errorf("a 4 KiB cache holds %d of 40 mailboxes", n)
	}
	big := storetest.UserInbox(t, e, "big@example.test")
	batch := make([]store.NewMessage, listMaxLen+1)
	for i := range batch {
		batch[i] = store.NewMessage{Body: []byte("b"), Size: 1}
	}
	e2 := open(t, t.TempDir())
	defer e2.Close()
	big2 := storetest.UserInbox(t, e2, "big@example.test")
	for _, c := range []struct {
		e  *Engine
		mb store.ID
	}{{e, big.ID}, {e2, big2.ID}} {
		if _, err := writer(c.e).Append(ctx, c.mb, batch, store.AppendOptions{}); err != nil {
			t.Fatal(err)
		}
		if c.e.lists.m[c.mb] != nil {
			t.Errorf("a mailbox of %d messages is cached", len(batch))
		}
	}
	checkClean(t, e)
}

// BenchmarkMaildropCycle is a POP3 session's store work on a maildrop that
// has been delivered to and drained many times: list it, then expunge
// what was listed, with three deliveries in between, from 16 goroutines
// per CPU, each on a mailbox of its own; with and without listCache. Its
// wall time is mostly fsync waits, so it also reports the process's CPU
// per cycle (cpu-µs/op), which is what the cache saves.
func BenchmarkMaildropCycle(b *testing.B) {
	body := []byte(strings.Repeat("x", 4700))
	for _, tc := range []struct {
		name  string
		bytes int
	}{{"cached", 0}, {"uncached", -1}} {
		b.Run(tc.name, func(b *testing.B) {
			ctx := context.Background()
			e, err := Open(b.TempDir(), Options{ListCacheBytes: tc.bytes})
			if err != nil {
				b.Fatal(err)
			}
			defer e.Close()
			var mu sync.Mutex
			var boxes []store.ID
			for i := range 16 * runtime.GOMAXPROCS(0) {
				boxes = append(boxes, storetest.UserInbox(b, e, fmt.Sprintf("u%d@example.test", i)).ID)
			}
			nm := []store.NewMessage{{Body: body, Size: int64(len(body))}}
			b.SetParallelism(16)
			cpu0 := processCPU(b)
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				mu.Lock()
				mb := boxes[0]
				boxes = boxes[1:]
				mu.Unlock()
				for pb.Next() {
					for range 3 {
						if _, err := writer(e).Append(ctx, mb, nm, store.AppendOptions{}); err != nil {
							b.Fatal(err)
						}
					}
					msgs, err := e.ListMessages(ctx, mb, 1, 1000)
					if err != nil {
						b.Fatal(err)
					}
					uids := make([]uint32, len(msgs))
					for i, m := range msgs {
						uids[i] = m.UID
					}
					if _, _, err := writer(e).Expunge(ctx, mb, slices.Clip(uids)); err != nil {
						b.Fatal(err)
					}
				}
			})
			b.ReportMetric(float64((processCPU(b)-cpu0).Microseconds())/float64(b.N), "cpu-µs/op")
		})
	}
}

// processCPU is the user and system CPU time the test process has used.
func processCPU(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
