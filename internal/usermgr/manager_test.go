package usermgr

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"quill/internal/store"
	"quill/internal/store/embedded"
	"quill/internal/store/storetest"
)

func openEngine(t testing.TB) *embedded.Engine {
	t.Helper()
	e, err := embedded.Open(t.TempDir(), embedded.Options{})
	if err != nil {
		t.Fatal(err)
	}
	return e
}

func ctx() context.Context { return context.Background() }

// inbox creates the user addr (quota in octets, 0 for none) and returns its
// INBOX.
func inbox(t testing.TB, st store.Store, addr string, quota int64) store.Mailbox {
	t.Helper()
	if err := st.CreateUser(ctx(), store.User{Address: addr, PasswordHash: "h", QuotaBytes: quota}); err != nil {
		t.Fatal(err)
	}
	mb, err := st.GetMailbox(ctx(), addr, "INBOX")
	if err != nil {
		t.Fatal(err)
	}
	return mb
}

func body(s string) store.NewMessage {
	return store.NewMessage{Body: []byte(s), Size: int64(len(s)), InternalDate: time.Now()}
}

// recorder is a Notifier that counts events per mailbox.
type recorder struct {
	mu sync.Mutex
	n  map[store.ID]int
}

func (r *recorder) Notify(id store.ID) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.n == nil {
		r.n = map[store.ID]int{}
	}
	r.n[id]++
}

func (r *recorder) count(id store.ID) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.n[id]
}

// Every durable write is announced once, on the mailbox it changed, and
// by the time the event is out a reader sees the write.
func TestEventsFollowDurableWrites(t *testing.T) {
	e := openEngine(t)
	var rec recorder
	m := New(e, Options{Notifier: &rec})
	defer m.Close()
	mb := inbox(t, m, "a@x", 0)
	got, err := m.Append(ctx(), mb.ID, []store.NewMessage{body("one"), body("two")}, store.AppendOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if rec.count(mb.ID) != 1 {
		t.Fatalf("after append: %d events, want 1", rec.count(mb.ID))
	}
	if _, err := m.SetFlags(ctx(), mb.ID, store.FlagChange{UIDs: []uint32{got[0].UID}, Op: store.FlagsAdd, Flags: []string{store.FlagSeen}}); err != nil {
		t.Fatal(err)
	}
	// A change that changes nothing is no event.
	if _, err := m.SetFlags(ctx(), mb.ID, store.FlagChange{UIDs: []uint32{got[0].UID}, Op: store.FlagsAdd, Flags: []string{store.FlagSeen}}); err != nil {
		t.Fatal(err)
	}
	if rec.count(mb.ID) != 2 {
		t.Fatalf("after flags: %d events, want 2", rec.count(mb.ID))
	}
	gone, _, err := m.Expunge(ctx(), mb.ID, []uint32{got[1].UID, 999})
	if err != nil || len(gone) != 1 {
		t.Fatalf("Expunge: %v %v", gone, err)
	}
	if rec.count(mb.ID) != 3 {
		t.Fatalf("after expunge: %d events, want 3", rec.count(mb.ID))
	}
	cur, err := e.GetMailboxByID(ctx(), mb.ID)
	if err != nil || cur.Messages != 1 || cur.UIDNext != 3 || cur.HighestModSeq != mb.HighestModSeq+3 {
		t.Fatalf("mailbox after three writes: %+v %v", cur, err)
	}
}

// A batch built on a stale head (a second manager of the same user wrote
// meanwhile, as a deposed one would) is refused by the engine's
// assertions, nothing of it is written, and the manager reloads and
// carries on without reusing a UID.
func TestStaleBatchRefusedAndRecovered(t *testing.T) {
	e := openEngine(t)
	m := New(e, Options{})
	defer m.Close()
	mb := inbox(t, m, "a@x", 0)
	if _, err := m.Append(ctx(), mb.ID, []store.NewMessage{body("one")}, store.AppendOptions{}); err != nil {
		t.Fatal(err)
	}
	// Another manager's append: UID 2, unknown to the first.
	if _, err := New(e, Options{}).Append(ctx(), mb.ID, []store.NewMessage{body("around")}, store.AppendOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := m.Append(ctx(), mb.ID, []store.NewMessage{body("stale")}, store.AppendOptions{}); !errors.Is(err, store.ErrConflict) {
		t.Fatalf("append on a stale head: %v, want ErrConflict", err)
	}
	got, err := m.Append(ctx(), mb.ID, []store.NewMessage{body("after")}, store.AppendOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got[0].UID != 3 {
		t.Fatalf("UID after reload: %d, want 3", got[0].UID)
	}
	msgs, err := e.ListMessages(ctx(), mb.ID, 1, 10)
	if err != nil || len(msgs) != 3 {
		t.Fatalf("messages: %d %v, want 3", len(msgs), err)
	}
	checkStore(t, e)
}

// The quota is checked against usage the manager keeps across batches in
// flight, and reloaded after a deletion changed it.
func TestQuotaAcrossConcurrentAppends(t *testing.T) {
	e := openEngine(t)
	m := New(e, Options{})
	defer m.Close()
	mb := inbox(t, m, "a@x", 1000)
	var ok, over atomic.Int32
	var wg sync.WaitGroup
	for range 40 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := m.Append(ctx(), mb.ID, []store.NewMessage{body(strings.Repeat("x", 100))}, store.AppendOptions{CheckQuota: true})
			switch {
			case err == nil:
				ok.Add(1)
			case errors.Is(err, store.ErrOverQuota):
				over.Add(1)
			default:
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	if ok.Load() != 10 || over.Load() != 30 {
		t.Fatalf("%d stored, %d over quota; want 10 and 30", ok.Load(), over.Load())
	}
	if err := m.DeleteMailbox(ctx(), "a@x", "INBOX"); err == nil {
		t.Fatal("INBOX deleted")
	}
	sub, err := m.CreateMailbox(ctx(), "a@x", "Sub", store.MailboxOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := m.Expunge(ctx(), mb.ID, []uint32{1, 2}); err != nil {
		t.Fatal(err)
	}
	if _, err := m.Append(ctx(), sub.ID, []store.NewMessage{body(strings.Repeat("y", 200))}, store.AppendOptions{CheckQuota: true}); err != nil {
		t.Fatalf("append after freeing 200 octets: %v", err)
	}
	checkStore(t, e)
}

// userReads counts the GetUser calls of a real engine.
type userReads struct {
	*embedded.Engine
	n atomic.Int32
}

func (u *userReads) GetUser(ctx context.Context, address string) (store.User, error) {
	u.n.Add(1)
	return u.Engine.GetUser(ctx, address)
}

// TestQuotaGivenByTheCaller: an append whose caller passes the quota it
// read (a delivery's recipient check did) is checked against that quota
// without reading the user again; without it, the stored quota applies.
func TestQuotaGivenByTheCaller(t *testing.T) {
	e := &userReads{Engine: openEngine(t)}
	m := New(e, Options{})
	defer m.Close()
	mb := inbox(t, m, "q@x", 1000)
	small := int64(150)
	opts := store.AppendOptions{CheckQuota: true, UserQuota: &small}
	before := e.n.Load()
	if _, err := m.Append(ctx(), mb.ID, []store.NewMessage{body(strings.Repeat("x", 100))}, opts); err != nil {
		t.Fatal(err)
	}
	if _, err := m.Append(ctx(), mb.ID, []store.NewMessage{body(strings.Repeat("x", 100))}, opts); !errors.Is(err, store.ErrOverQuota) {
		t.Fatalf("append over the given quota: %v; want store.ErrOverQuota", err)
	}
	if n := e.n.Load() - before; n != 0 {
		t.Fatalf("the user was read %d times with its quota given", n)
	}
	if _, err := m.Append(ctx(), mb.ID, []store.NewMessage{body(strings.Repeat("x", 100))}, store.AppendOptions{CheckQuota: true}); err != nil {
		t.Fatalf("append within the stored quota: %v", err)
	}
	if e.n.Load() == before {
		t.Fatal("the stored quota was not read")
	}
}

// Many writers on one mailbox, appends, flag changes and expunges mixed,
// while a reader follows the change log: every MODSEQ it sees is above the
// last it saw, every UID it sees added is above every UID seen added
// before, and the counts agree at the end.
func TestConcurrentWritersOneMailbox(t *testing.T) {
	e := openEngine(t)
	m := New(e, Options{})
	defer m.Close()
	mb := inbox(t, m, "a@x", 0)
	stop := make(chan struct{})
	readerDone := make(chan error, 1)
	go func() {
		var since uint64
		var maxUID uint32
		seen := map[uint32]bool{}
		for {
			select {
			case <-stop:
				readerDone <- nil
				return
			default:
			}
			ch, err := e.Changes(ctx(), mb.ID, since, 1000)
			if errors.Is(err, store.ErrExpungesForgotten) {
				readerDone <- nil
				return
			}
			if err != nil {
				readerDone <- err
				return
			}
			for _, c := range ch {
				if c.ModSeq < since {
					readerDone <- fmt.Errorf("MODSEQ %d after %d", c.ModSeq, since)
					return
				}
				since = c.ModSeq
				if c.Kind == store.ChangeAdded && !seen[c.UID] {
					if c.UID <= maxUID {
						readerDone <- fmt.Errorf("UID %d added after %d", c.UID, maxUID)
						return
					}
					maxUID = c.UID
					seen[c.UID] = true
				}
			}
		}
	}()
	var wg sync.WaitGroup
	for w := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 50 {
				got, err := m.Append(ctx(), mb.ID, []store.NewMessage{body(fmt.Sprintf("w%d m%d", w, i))}, store.AppendOptions{})
				if err != nil {
					t.Error(err)
					return
				}
				uid := got[0].UID
				switch i % 3 {
				case 1:
					_, err = m.SetFlags(ctx(), mb.ID, store.FlagChange{UIDs: []uint32{uid}, Op: store.FlagsAdd, Flags: []string{store.FlagSeen}})
				case 2:
					_, _, err = m.Expunge(ctx(), mb.ID, []uint32{uid})
				}
				if err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(stop)
	if err := <-readerDone; err != nil {
		t.Fatal(err)
	}
	cur, err := e.GetMailboxByID(ctx(), mb.ID)
	if err != nil {
		t.Fatal(err)
	}
	if want := uint32(8 * (50 - 16)); cur.Messages != want || cur.UIDNext != 401 {
		t.Fatalf("mailbox: %d messages, UIDNEXT %d; want %d and 401", cur.Messages, cur.UIDNext, want)
	}
	checkStore(t, e)
}

// Users beyond MaxUsers are forgotten when idle and rebuilt from the store
// when next written, without reusing a UID.
func TestEvictedUsersRebuilt(t *testing.T) {
	e := openEngine(t)
	m := New(e, Options{MaxUsers: 4})
	defer m.Close()
	var boxes []store.Mailbox
	for i := range 20 {
		boxes = append(boxes, inbox(t, m, fmt.Sprintf("u%d@x", i), 0))
	}
	for round := range 3 {
		for _, mb := range boxes {
			got, err := m.Append(ctx(), mb.ID, []store.NewMessage{body("m")}, store.AppendOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if got[0].UID != uint32(round+1) {
				t.Fatalf("round %d: UID %d", round, got[0].UID)
			}
		}
	}
	m.mu.Lock()
	n := m.users.n
	m.mu.Unlock()
	if n > 4 {
		t.Fatalf("%d users kept, max 4", n)
	}
	checkStore(t, e)
}

func checkStore(t *testing.T, st store.Engine) {
	t.Helper()
	problems, err := st.Check(ctx())
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Error(p)
	}
}

// A move is one batch: a reader polling both mailboxes throughout never
// sees the moved messages in both or in neither, the counts, usage and
// blob references agree afterwards, and both mailboxes hear of it.
func TestMoveIsAtomic(t *testing.T) {
	e := openEngine(t)
	var rec recorder
	m := New(e, Options{Notifier: &rec})
	defer m.Close()
	src := inbox(t, m, "a@x", 0)
	dst, err := m.CreateMailbox(ctx(), "a@x", "Archive", store.MailboxOptions{})
	if err != nil {
		t.Fatal(err)
	}
	const n = 200
	var uids []uint32
	for i := range n {
		got, err := m.Append(ctx(), src.ID, []store.NewMessage{body(fmt.Sprintf("m%d", i))}, store.AppendOptions{})
		if err != nil {
			t.Fatal(err)
		}
		uids = append(uids, got[0].UID)
	}
	usage, _ := m.Usage(ctx(), "a@x")
	stop := make(chan struct{})
	bad := make(chan string, 1)
	go func() {
		defer close(bad)
		for {
			select {
			case <-stop:
				return
			default:
			}
			// Source, then destination: a move between the two reads
			// shows as more, never fewer, unless some moment had the
			// messages in neither mailbox.
			a, err1 := e.GetMailboxByID(ctx(), src.ID)
			b, err2 := e.GetMailboxByID(ctx(), dst.ID)
			// Destination, then source: fewer, never more, unless some
			// moment had them in both.
			b2, err3 := e.GetMailboxByID(ctx(), dst.ID)
			a2, err4 := e.GetMailboxByID(ctx(), src.ID)
			if err := errors.Join(err1, err2, err3, err4); err != nil {
				bad <- err.Error()
				return
			}
			if a.Messages+b.Messages < n {
				bad <- fmt.Sprintf("%d + %d messages, fewer than %d: some in neither mailbox", a.Messages, b.Messages, n)
				return
			}
			if a2.Messages+b2.Messages > n {
				bad <- fmt.Sprintf("%d + %d messages, more than %d: some in both mailboxes", a2.Messages, b2.Messages, n)
				return
			}
		}
	}()
	for i := 0; i < n; i += 10 {
		from, to, err := m.Move(ctx(), src.ID, uids[i:i+10], dst.ID)
		if err != nil {
			t.Fatal(err)
		}
		if len(from) != 10 || len(to) != 10 || to[0] != uint32(i+1) {
			t.Fatalf("move %d: %v -> %v", i, from, to)
		}
	}
	close(stop)
	if msg, ok := <-bad; ok {
		t.Fatal(msg)
	}
	a, _ := e.GetMailboxByID(ctx(), src.ID)
	b, _ := e.GetMailboxByID(ctx(), dst.ID)
	if a.Messages != 0 || b.Messages != n || b.UIDNext != n+1 {
		t.Fatalf("after moves: source %+v, destination %+v", a, b)
	}
	if after, _ := m.Usage(ctx(), "a@x"); after != usage {
		t.Fatalf("usage %+v after moves, %+v before", after, usage)
	}
	if rec.count(dst.ID) != n/10 {
		t.Fatalf("%d events on the destination, want %d", rec.count(dst.ID), n/10)
	}
	// Within one mailbox: new UIDs, the same count; already moved UIDs
	// are skipped.
	from, to, err := m.Move(ctx(), dst.ID, []uint32{1, 2, 999}, dst.ID)
	if err != nil || len(from) != 2 || to[0] != n+1 {
		t.Fatalf("move within a mailbox: %v -> %v, %v", from, to, err)
	}
	b, _ = e.GetMailboxByID(ctx(), dst.ID)
	if b.Messages != n || b.UIDNext != n+3 {
		t.Fatalf("after a move within: %+v", b)
	}
	// Another user's mailbox is not a destination.
	other := inbox(t, m, "b@x", 0)
	if _, _, err := m.Move(ctx(), dst.ID, []uint32{3}, other.ID); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("move to another user's mailbox: %v", err)
	}
	checkStore(t, e)
}

// epochOwner is an Owner whose epoch the test moves, or that refuses.
type epochOwner struct {
	epoch atomic.Uint64
	deny  atomic.Bool
}

var errNotManaged = errors.New("not managed here")

func (o *epochOwner) Epoch(string) (uint64, error) {
	if o.deny.Load() {
		return 0, errNotManaged
	}
	return o.epoch.Load(), nil
}

// adoptingEngine is the embedded engine seen through the fencing contract
// of a shared engine: it records the epochs of adoptions and batches.
type adoptingEngine struct {
	*embedded.Engine
	mu      sync.Mutex
	adopted []uint64
	batches []uint64
}

func (a *adoptingEngine) AdoptMailbox(ctx context.Context, id store.ID, epoch uint64) (store.Mailbox, error) {
	a.mu.Lock()
	a.adopted = append(a.adopted, epoch)
	a.mu.Unlock()
	return a.GetMailboxByID(ctx, id)
}

func (a *adoptingEngine) SubmitBatch(ctx context.Context, b *store.Batch) (func() error, error) {
	a.mu.Lock()
	a.batches = append(a.batches, b.Epoch)
	a.mu.Unlock()
	return a.Engine.SubmitBatch(ctx, b)
}

// The manager writes under the owner's epoch: a mailbox is adopted once per
// epoch before its first batch, every batch carries the epoch, a new epoch
// makes it adopt again, and a user it does not manage is refused.
func TestWritesCarryTheOwnersEpoch(t *testing.T) {
	e := &adoptingEngine{Engine: openEngine(t)}
	var o epochOwner
	o.epoch.Store(7)
	m := New(e, Options{Owner: &o})
	defer m.Close()
	mb := inbox(t, m, "a@x", 0)
	for range 3 {
		if _, err := m.Append(ctx(), mb.ID, []store.NewMessage{body("m")}, store.AppendOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	o.epoch.Store(9)
	got, err := m.Append(ctx(), mb.ID, []store.NewMessage{body("m")}, store.AppendOptions{})
	if err != nil || got[0].UID != 4 {
		t.Fatalf("append in the new epoch: %v %v", got, err)
	}
	e.mu.Lock()
	adopted, batches := slices.Clone(e.adopted), slices.Clone(e.batches)
	e.mu.Unlock()
	if !slices.Equal(adopted, []uint64{7, 9}) || !slices.Equal(batches, []uint64{7, 7, 7, 9}) {
		t.Fatalf("adopted at %v, batches at %v; want [7 9] and [7 7 7 9]", adopted, batches)
	}
	o.deny.Store(true)
	if _, err := m.Append(ctx(), mb.ID, []store.NewMessage{body("m")}, store.AppendOptions{}); !errors.Is(err, errNotManaged) {
		t.Fatalf("append for a user not managed here: %v", err)
	}
}

// A batch the engine applied but reported as of unknown outcome
// (store.ErrOutcomeUnknown, injected after the real write): the caller
// gets that error, the write is visible and announced, the user is not
// forgotten before its state is reloaded, and the next writes neither
// reuse its UID or MODSEQ nor ignore its size in the quota.
func TestUnknownOutcomeReloads(t *testing.T) {
	e := openEngine(t)
	u := storetest.NewUncertain(e)
	var rec recorder
	m := New(u, Options{Notifier: &rec, MaxUsers: 1})
	defer m.Close()
	mb := inbox(t, m, "a@x", 10)
	if _, err := m.Append(ctx(), mb.ID, []store.NewMessage{body("four")}, store.AppendOptions{CheckQuota: true}); err != nil {
		t.Fatal(err)
	}
	u.Arm(1)
	_, err := m.Append(ctx(), mb.ID, []store.NewMessage{body("five.")}, store.AppendOptions{CheckQuota: true})
	if !errors.Is(err, store.ErrOutcomeUnknown) || u.Injected() != 1 {
		t.Fatalf("append reported unknown: %v (%d injected), want ErrOutcomeUnknown", err, u.Injected())
	}
	if msg, err := e.GetMessage(ctx(), mb.ID, 2); err != nil || msg.Size != 5 {
		t.Fatalf("the append of unknown outcome in the store: %+v, %v", msg, err)
	}
	if rec.count(mb.ID) != 2 {
		t.Fatalf("events after a durable and an unknown append: %d, want 2", rec.count(mb.ID))
	}
	// Another user, with MaxUsers 1: a.x must not be forgotten while its
	// failed batch awaits the reload.
	other := inbox(t, m, "b@x", 0)
	if _, err := m.Append(ctx(), other.ID, []store.NewMessage{body("b")}, store.AppendOptions{}); err != nil {
		t.Fatal(err)
	}
	if !m.kept("a@x") {
		t.Fatal("the user with a batch of unknown outcome was evicted before its reload")
	}
	// 4 + 5 octets stored, quota 10: two more do not fit, one does.
	if _, err := m.Append(ctx(), mb.ID, []store.NewMessage{body("xy")}, store.AppendOptions{CheckQuota: true}); !errors.Is(err, store.ErrOverQuota) {
		t.Fatalf("append over quota after the unknown one: %v, want ErrOverQuota", err)
	}
	got, err := m.Append(ctx(), mb.ID, []store.NewMessage{body("z")}, store.AppendOptions{CheckQuota: true})
	if err != nil {
		t.Fatal(err)
	}
	cur, _ := e.GetMailboxByID(ctx(), mb.ID)
	if got[0].UID != 3 || got[0].ModSeq != cur.HighestModSeq || cur.Messages != 3 {
		t.Fatalf("append after the unknown one: %+v; mailbox %+v", got[0], cur)
	}
	checkStore(t, e)
}

// KnownRoom answers from the usage the manager keeps, and only while it
// keeps it under the current term: not for a user whose usage it never
// read, nor after the term changed or the user left this node.
func TestKnownRoom(t *testing.T) {
	e := openEngine(t)
	var o epochOwner
	o.epoch.Store(3)
	m := New(e, Options{Owner: &o})
	defer m.Close()
	mb := inbox(t, m, "a@x", 1000)
	if _, known := m.KnownRoom("a@x", 1000, 10); known {
		t.Fatal("room known before any usage was read")
	}
	if _, err := m.Append(ctx(), mb.ID, []store.NewMessage{body(strings.Repeat("x", 600))}, store.AppendOptions{CheckQuota: true}); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		size int64
		room bool
	}{{0, true}, {400, true}, {401, false}} {
		if room, known := m.KnownRoom("a@x", 1000, tc.size); !known || room != tc.room {
			t.Errorf("KnownRoom(size %d) = %v, %v; want %v, true", tc.size, room, known, tc.room)
		}
	}
	if room, known := m.KnownRoom("a@x", 600, 0); !known || room {
		t.Errorf("a user exactly at her quota: room %v, known %v; want no room", room, known)
	}
	if _, known := m.KnownRoom("b@x", 1000, 10); known || m.kept("b@x") {
		t.Error("room known, or state kept, for a user never written")
	}
	// An expunge lowers the usage kept.
	if _, _, err := m.Expunge(ctx(), mb.ID, []uint32{1}); err != nil {
		t.Fatal(err)
	}
	if room, known := m.KnownRoom("a@x", 1000, 1000); !known || !room {
		t.Errorf("after the expunge: room %v, known %v; want room", room, known)
	}
	o.epoch.Store(4)
	if _, known := m.KnownRoom("a@x", 1000, 10); known {
		t.Error("room known from a previous term")
	}
	o.epoch.Store(3)
	o.deny.Store(true)
	if _, known := m.KnownRoom("a@x", 1000, 10); known {
		t.Error("room known for a user not managed here")
	}
}
