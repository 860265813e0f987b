package forward_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"quill/internal/cluster"
	"quill/internal/cluster/credentials"
	"quill/internal/cluster/forward"
	"quill/internal/cluster/usermap"
	"quill/internal/store"
	"quill/internal/store/embedded"
	"quill/internal/usermgr"
)

// node is one cluster node in this process: its cluster.Node (transport,
// membership, ownership on the shared store), its user manager, the
// forwarding store its services would use and the handler of what others
// forward to it.
type node struct {
	c   *cluster.Node
	mgr *usermgr.Manager
	fs  *forward.Store
	reg *prometheus.Registry
}

type hub struct{ ch chan store.ID }

func (h hub) Notify(id store.ID) {
	select {
	case h.ch <- id:
	default:
	}
}

func startNode(t *testing.T, st *embedded.Engine, timeout time.Duration, join ...string) *node {
	t.Helper()
	reg := prometheus.NewRegistry()
	c, err := cluster.Start(context.Background(), cluster.Options{
		DataDir: t.TempDir(), Addr: "127.0.0.1:0", Join: join, Secrets: st, Ownership: st,
		LeaseTerm: time.Second, DetectionTimeout: time.Second, Registerer: reg,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Shutdown(context.Background()) })
	mgr := usermgr.New(st, usermgr.Options{Owner: c.Owner()})
	h, err := forward.NewHandler(mgr, c.Owner(), reg)
	if err != nil {
		t.Fatal(err)
	}
	c.ServeForwarded(h)
	fs, err := forward.New(forward.Options{Local: mgr, Owner: c.Owner(), Peers: c, Timeout: timeout, Registerer: reg})
	if err != nil {
		t.Fatal(err)
	}
	return &node{c: c, mgr: mgr, fs: fs, reg: reg}
}

func eventually(t *testing.T, within time.Duration, what string, cond func() error) {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		err := cond()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %v: %v", what, within, err)
		}
		time.Sleep(10 * time.Millisecond) // paces the polling of an observable condition
	}
}

func managedTotal(nodes ...*node) error {
	total := 0
	for _, n := range nodes {
		total += n.c.Owner().Status().Managed
	}
	if total != usermap.Buckets {
		return fmt.Errorf("%d buckets managed", total)
	}
	return nil
}

// forwarded sums quill_cluster_forwarded_total's series with result.
func forwarded(n *node, result string) float64 {
	mfs, _ := n.reg.Gather()
	sum := 0.0
	for _, mf := range mfs {
		if mf.GetName() != "quill_cluster_forwarded_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "result" && l.GetValue() == result {
					sum += m.GetCounter().GetValue()
				}
			}
		}
	}
	return sum
}

// TestWritesReachTheManager: two nodes on one store; every mailbox write
// made through either node's forwarding store for users of both nodes is
// applied, once, by the user's manager: through the other node when it
// manages the user. An inline body forwarded is stored by the sender and
// read back byte-exact; store errors cross the channel classified.
func TestWritesReachTheManager(t *testing.T) {
	st, err := embedded.Open(filepath.Join(t.TempDir(), "store"), embedded.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	ctx := context.Background()
	if _, _, err := credentials.Init(ctx, st, time.Now()); err != nil {
		t.Fatal(err)
	}
	a := startNode(t, st, 5*time.Second)
	b := startNode(t, st, 5*time.Second, a.c.Addr())
	eventually(t, 20*time.Second, "both nodes manage every bucket between them", func() error { return managedTotal(a, b) })

	// Users of both nodes.
	var users []string
	onA, onB := 0, 0
	for i := 0; onA < 3 || onB < 3; i++ {
		u := fmt.Sprintf("user%d@example.test", i)
		if _, err := a.c.Owner().Epoch(u); err == nil {
			if onA >= 3 {
				continue
			}
			onA++
		} else {
			if onB >= 3 {
				continue
			}
			onB++
		}
		if err := st.CreateUser(ctx, store.User{Address: u, PasswordHash: "x", QuotaBytes: 1 << 20}); err != nil {
			t.Fatal(err)
		}
		if _, err := st.CreateMailbox(ctx, u, "Archive", store.MailboxOptions{}); err != nil {
			t.Fatal(err)
		}
		users = append(users, u)
	}
	for _, u := range users {
		inbox, err := st.GetMailbox(ctx, u, "INBOX")
		if err != nil {
			t.Fatal(err)
		}
		archive, _ := st.GetMailbox(ctx, u, "Archive")
		for i, via := range []*node{a, b} {
			body := []byte(fmt.Sprintf("Subject: %s via %d\r\n\r\nbody\r\n", u, i))
			got, err := via.fs.Append(ctx, inbox.ID, []store.NewMessage{{Body: body, Size: int64(len(body)),
				Flags: []string{"$Label"}, InternalDate: time.Unix(1700000000, 0)}}, store.AppendOptions{CheckQuota: true})
			if err != nil {
				t.Fatalf("append for %s via node %d: %v", u, i, err)
			}
			if len(got) != 1 || got[0].UID != uint32(i+1) || got[0].Size != int64(len(body)) {
				t.Fatalf("append for %s via node %d = %+v", u, i, got)
			}
			stored, err := st.GetMessage(ctx, inbox.ID, got[0].UID)
			if err != nil || stored.Blob != got[0].Blob || !slices.Equal(stored.Flags, []string{"$Label"}) {
				t.Fatalf("stored %+v, %v; append said %+v", stored, err, got[0])
			}
			r, err := st.OpenBlob(ctx, stored.Blob)
			if err != nil {
				t.Fatal(err)
			}
			read, _ := io.ReadAll(r)
			r.Close()
			if string(read) != string(body) {
				t.Fatalf("body read back %q, want %q", read, body)
			}
		}
		// The manager knows the user's usage from the quota checks of the
		// appends; the other node does not, and says so.
		mgr, other := a, b
		if _, err := a.c.Owner().Epoch(u); err != nil {
			mgr, other = b, a
		}
		if room, known := mgr.fs.KnownRoom(u, 1<<20, 1000); !known || !room {
			t.Fatalf("KnownRoom(%s) at its manager = %v, %v; want room, known", u, room, known)
		}
		if _, known := other.fs.KnownRoom(u, 1<<20, 1000); known {
			t.Fatalf("KnownRoom(%s) on a node that does not manage it: known", u)
		}
		res, err := b.fs.SetFlags(ctx, inbox.ID, store.FlagChange{UIDs: []uint32{1, 2}, Op: store.FlagsAdd, Flags: []string{store.FlagSeen}})
		if err != nil || len(res.Changed) != 2 {
			t.Fatalf("SetFlags for %s via b = %+v, %v", u, res, err)
		}
		src, dst, err := a.fs.Move(ctx, inbox.ID, []uint32{1}, archive.ID)
		if err != nil || !slices.Equal(src, []uint32{1}) || !slices.Equal(dst, []uint32{1}) {
			t.Fatalf("Move for %s via a = %v %v, %v", u, src, dst, err)
		}
		gone, _, err := b.fs.Expunge(ctx, inbox.ID, []uint32{2})
		if err != nil || !slices.Equal(gone, []uint32{2}) {
			t.Fatalf("Expunge for %s via b = %v, %v", u, gone, err)
		}
		if mb, _ := st.GetMailboxByID(ctx, inbox.ID); mb.Messages != 0 || mb.UIDNext != 3 {
			t.Fatalf("INBOX of %s after the writes: %+v", u, mb)
		}
		if mb, _ := st.GetMailboxByID(ctx, archive.ID); mb.Messages != 1 {
			t.Fatalf("Archive of %s after the move: %+v", u, mb)
		}
		// Store errors keep their class across the channel.
		big := make([]byte, 2<<20)
		_, err = a.fs.Append(ctx, archive.ID, []store.NewMessage{{Body: big, Size: int64(len(big))}}, store.AppendOptions{CheckQuota: true})
		if !errors.Is(err, store.ErrOverQuota) {
			t.Fatalf("an append over quota for %s via a = %v, want ErrOverQuota", u, err)
		}
		if err := b.fs.DeleteMailbox(ctx, u, "Archive"); err != nil {
			t.Fatalf("DeleteMailbox for %s via b: %v", u, err)
		}
		if err := a.fs.DeleteMailbox(ctx, u, "Archive"); !errors.Is(err, store.ErrNotFound) {
			t.Fatalf("DeleteMailbox of a deleted mailbox via a = %v, want ErrNotFound", err)
		}
	}
	if fa, fb := forwarded(a, "ok"), forwarded(b, "ok"); fa == 0 || fb == 0 {
		t.Fatalf("writes forwarded: %v by a, %v by b; want some by each", fa, fb)
	}
	for _, u := range users {
		if err := a.fs.DeleteUser(ctx, u); err != nil {
			t.Fatalf("DeleteUser(%s) via a: %v", u, err)
		}
	}
}

// TestManagerGone: when the manager of a user stops, a write through the
// other node fails with ErrManagerUnreachable (temporary) while the
// bucket changes hands, if its bound is short, and succeeds once the
// other node manages the bucket; the longer bound rides the handoff out.
func TestManagerGone(t *testing.T) {
	st, err := embedded.Open(filepath.Join(t.TempDir(), "store"), embedded.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	ctx := context.Background()
	if _, _, err := credentials.Init(ctx, st, time.Now()); err != nil {
		t.Fatal(err)
	}
	a := startNode(t, st, 5*time.Second)
	b := startNode(t, st, 5*time.Second, a.c.Addr())
	eventually(t, 20*time.Second, "both nodes manage every bucket between them", func() error { return managedTotal(a, b) })
	var user string
	for i := 0; ; i++ {
		user = fmt.Sprintf("user%d@example.test", i)
		if _, err := b.c.Owner().Epoch(user); err == nil {
			break
		}
	}
	if err := st.CreateUser(ctx, store.User{Address: user, PasswordHash: "x"}); err != nil {
		t.Fatal(err)
	}
	inbox, _ := st.GetMailbox(ctx, user, "INBOX")
	msg := func() []store.NewMessage { return []store.NewMessage{{Body: []byte("x\r\n"), Size: 3}} }
	if _, err := a.fs.Append(ctx, inbox.ID, msg(), store.AppendOptions{}); err != nil {
		t.Fatal(err)
	}
	short, err := forward.New(forward.Options{Local: a.mgr, Owner: a.c.Owner(), Peers: a.c, Timeout: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	// b stops: it gives its lease up and leaves; until a takes its
	// buckets, writes for user cannot be applied anywhere.
	stopped := time.Now()
	if err := b.c.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := short.Append(ctx, inbox.ID, msg(), store.AppendOptions{}); !errors.Is(err, forward.ErrManagerUnreachable) || !errors.Is(err, store.ErrUnavailable) {
		t.Fatalf("append with a 20ms bound right after the manager stopped = %v, want ErrManagerUnreachable", err)
	}
	got, err := a.fs.Append(ctx, inbox.ID, msg(), store.AppendOptions{})
	if err != nil {
		t.Fatalf("append with a 5s bound across the handoff: %v", err)
	}
	t.Logf("manager stopped to the next write applied through the other node: %v", time.Since(stopped))
	if got[0].UID != 2 {
		t.Fatalf("UID after the handoff %d, want 2", got[0].UID)
	}
}

// faultyLocal is a node's real user manager behind its Handler, with
// faults injected into Append: refuse (nothing applied, store.ErrUnavailable)
// once; apply and report store.ErrOutcomeUnknown; or apply, then stop the
// node (its connections close under the call) and answer nothing.
type faultyLocal struct {
	forward.Local
	mode atomic.Value // string
	stop func()
}

func (f *faultyLocal) Append(ctx context.Context, mailbox store.ID, msgs []store.NewMessage, opts store.AppendOptions) ([]store.Message, error) {
	switch f.mode.Swap("") {
	case "refuse":
		return nil, fmt.Errorf("disk full, nothing kept: %w", store.ErrUnavailable)
	case "unknown":
		if _, err := f.Local.Append(ctx, mailbox, msgs, opts); err != nil {
			return nil, err
		}
		return nil, fmt.Errorf("applied, answer lost: %w", store.ErrOutcomeUnknown)
	case "break":
		if _, err := f.Local.Append(ctx, mailbox, msgs, opts); err != nil {
			return nil, err
		}
		go f.stop()
		<-ctx.Done() // the server's Stop cancels the call
		return nil, ctx.Err()
	}
	return f.Local.Append(ctx, mailbox, msgs, opts)
}

// TestOutcomeUnknownNotRetried: a write the manager refused having applied
// nothing is retried and applied once; one the manager applied and then
// reported of unknown outcome, or applied and then lost its connection
// before answering, fails at the sender with ErrOutcomeUnknown (and
// store.ErrOutcomeUnknown, never store.ErrUnavailable) and is not retried:
// the message is stored exactly once, even once the sender's node has
// taken the user over.
func TestOutcomeUnknownNotRetried(t *testing.T) {
	st, err := embedded.Open(filepath.Join(t.TempDir(), "store"), embedded.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	ctx := context.Background()
	if _, _, err := credentials.Init(ctx, st, time.Now()); err != nil {
		t.Fatal(err)
	}
	a := startNode(t, st, 10*time.Second)
	b := startNode(t, st, 10*time.Second, a.c.Addr())
	eventually(t, 20*time.Second, "both nodes manage every bucket between them", func() error { return managedTotal(a, b) })
	f := &faultyLocal{Local: b.mgr, stop: func() {
		sctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		b.c.Shutdown(sctx)
	}}
	h, err := forward.NewHandler(f, b.c.Owner(), nil)
	if err != nil {
		t.Fatal(err)
	}
	b.c.ServeForwarded(h)
	var user string
	for i := 0; ; i++ {
		user = fmt.Sprintf("user%d@example.test", i)
		if _, err := b.c.Owner().Epoch(user); err == nil {
			break
		}
	}
	if err := st.CreateUser(ctx, store.User{Address: user, PasswordHash: "x"}); err != nil {
		t.Fatal(err)
	}
	inbox, _ := st.GetMailbox(ctx, user, "INBOX")
	msg := func() []store.NewMessage { return []store.NewMessage{{Body: []byte("x\r\n"), Size: 3}} }
	count := func() uint32 {
		t.Helper()
		mb, err := st.GetMailboxByID(ctx, inbox.ID)
		if err != nil {
			t.Fatal(err)
		}
		return mb.Messages
	}

	f.mode.Store("refuse")
	if _, err := a.fs.Append(ctx, inbox.ID, msg(), store.AppendOptions{}); err != nil {
		t.Fatalf("append refused once by the manager, then retried: %v", err)
	}
	if n := count(); n != 1 {
		t.Fatalf("after a refusal and its retry: %d messages, want 1", n)
	}

	f.mode.Store("unknown")
	_, err = a.fs.Append(ctx, inbox.ID, msg(), store.AppendOptions{})
	if !errors.Is(err, forward.ErrOutcomeUnknown) || !errors.Is(err, store.ErrOutcomeUnknown) || errors.Is(err, store.ErrUnavailable) {
		t.Fatalf("append the manager applied and reported unknown = %v, want ErrOutcomeUnknown only", err)
	}
	if n := count(); n != 2 {
		t.Fatalf("after the unknown append: %d messages, want 2", n)
	}

	f.mode.Store("break")
	_, err = a.fs.Append(ctx, inbox.ID, msg(), store.AppendOptions{})
	if !errors.Is(err, forward.ErrOutcomeUnknown) || !errors.Is(err, store.ErrOutcomeUnknown) || errors.Is(err, store.ErrUnavailable) {
		t.Fatalf("append applied by a manager that stopped before answering = %v, want ErrOutcomeUnknown", err)
	}
	t.Logf("sender's error: %v", err)
	if n := count(); n != 3 {
		t.Fatalf("after the append whose answer was lost: %d messages, want 3 (applied once)", n)
	}
	// a takes the user over; the next write goes through it, once.
	got, err := a.fs.Append(ctx, inbox.ID, msg(), store.AppendOptions{})
	if err != nil {
		t.Fatalf("append after the takeover: %v", err)
	}
	if n := count(); n != 4 || got[0].UID != 4 {
		t.Fatalf("after the takeover: %d messages, UID %d; want 4 and 4", n, got[0].UID)
	}
	if forwarded(a, "unknown") != 2 {
		t.Fatalf("quill_cluster_forwarded_total{result=unknown} = %v, want 2", forwarded(a, "unknown"))
	}
}
