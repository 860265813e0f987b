package ownership

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"quill/internal/cluster/credentials"
	"quill/internal/cluster/membership"
	"quill/internal/cluster/transport"
	"quill/internal/cluster/usermap"
	"quill/internal/store"
	"quill/internal/store/embedded"
)

// The tests run real nodes in one process: each with its own transport
// (mutual TLS on a loopback port), memberlist membership over it, and an
// Owner, all on one embedded store (its store.Ownership orders them as
// Cassandra's conditional writes order processes).
const (
	term      = 600 * time.Millisecond
	detection = time.Second
)

type node struct {
	id   string
	addr string
	tr   *transport.Transport
	mem  *membership.Membership
	own  *Owner
	once sync.Once
}

type testCluster struct {
	t   *testing.T
	rec *credentials.Record
	st  *embedded.Engine
}

func newTestCluster(t *testing.T) *testCluster {
	rec, err := credentials.Generate(time.Now())
	if err != nil {
		t.Fatal(err)
	}
	st, err := embedded.Open(filepath.Join(t.TempDir(), "store"), embedded.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	return &testCluster{t: t, rec: rec, st: st}
}

func (c *testCluster) start(join ...string) *node {
	c.t.Helper()
	id := credentials.NewNodeID()
	creds, err := c.rec.ForNode(id, credentials.NodeOptions{})
	if err != nil {
		c.t.Fatal(err)
	}
	tr, err := transport.Listen(transport.Options{Addr: "127.0.0.1:0", Node: creds})
	if err != nil {
		c.t.Fatal(err)
	}
	mem, err := membership.Start(context.Background(), membership.Options{
		ID: id, Transport: tr, GossipKey: creds.GossipKey(), Join: join, DetectionTimeout: detection,
	})
	if err != nil {
		tr.Close()
		c.t.Fatal(err)
	}
	own, err := Start(Options{ID: id, Store: c.st, Subscribe: mem.Subscribe, Term: term})
	if err != nil {
		c.t.Fatal(err)
	}
	n := &node{id: id, addr: tr.Addr().String(), tr: tr, mem: mem, own: own}
	c.t.Cleanup(func() { n.kill() })
	return n
}

// kill stops the node as kill -9 stops a process, except that the Owner
// keeps answering from its state (a paused or partitioned process would):
// its lease is no longer renewed, and membership hears nothing more.
func (n *node) kill() {
	n.once.Do(func() {
		n.own.stopLoops()
		n.mem.Close()
		n.tr.Close()
	})
}

// eventually polls cond until it holds or within passes.
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

// settled checks that every node in nodes adopted the newest epoch, which
// lists exactly members, and that the nodes manage every bucket between
// them, each on the node the map assigns it.
func settled(nodes []*node, members int) error {
	var epoch uint64
	total := 0
	for _, n := range nodes {
		st := n.own.Status()
		if epoch == 0 {
			epoch = st.Epoch
		}
		if st.Epoch != epoch || st.Adopted != epoch {
			return fmt.Errorf("node %s at epoch %d, adopted %d; another at %d", n.id[:8], st.Epoch, st.Adopted, epoch)
		}
		if len(st.Nodes) < members {
			return fmt.Errorf("epoch %d lists %d nodes, want %d", epoch, len(st.Nodes), members)
		}
		for _, ns := range st.Nodes {
			if ns.ID == n.id && ns.Buckets != st.Managed {
				return fmt.Errorf("node %s manages %d buckets of its %d", n.id[:8], st.Managed, ns.Buckets)
			}
		}
		total += st.Managed
	}
	if total != usermap.Buckets {
		return fmt.Errorf("the nodes manage %d buckets, want %d", total, usermap.Buckets)
	}
	return nil
}

// watcher checks, continuously, that no two nodes manage one bucket at
// once. Reading each node twice around the others' answers proves an
// overlap soundly: if node i answers epoch e before and after node j
// answers at all, i managed the bucket throughout (an epoch is one
// continuous management), so both did at j's answer.
type watcher struct {
	nodes      []*node
	stop       chan struct{}
	done       chan struct{}
	rounds     atomic.Int64
	violations atomic.Int64
	mu         sync.Mutex
	first      string
	last       map[uint32]string // the node last seen managing each bucket
	moved      map[uint32]int    // buckets seen managed by another node than before
}

func watch(nodes []*node) *watcher {
	w := &watcher{nodes: nodes, stop: make(chan struct{}), done: make(chan struct{}),
		last: map[uint32]string{}, moved: map[uint32]int{}}
	go w.run()
	return w
}

func (w *watcher) run() {
	defer close(w.done)
	k := len(w.nodes)
	a, b := make([]uint64, k), make([]uint64, k)
	for {
		select {
		case <-w.stop:
			return
		default:
		}
		for bk := range uint32(usermap.Buckets) {
			for i, n := range w.nodes {
				a[i] = n.own.Manages(bk)
			}
			for i, n := range w.nodes {
				b[i] = n.own.Manages(bk)
			}
			for i := range k {
				if a[i] == 0 || a[i] != b[i] {
					continue
				}
				for j := range k {
					between := a[j]
					if j < i {
						between = b[j]
					}
					if j != i && between != 0 {
						w.mu.Lock()
						if w.first == "" {
							w.first = fmt.Sprintf("bucket %d managed by %s (epoch %d) and %s (epoch %d) at once",
								bk, w.nodes[i].id[:8], a[i], w.nodes[j].id[:8], between)
						}
						w.mu.Unlock()
						w.violations.Add(1)
					}
				}
			}
			for i := range k {
				if b[i] != 0 {
					w.mu.Lock()
					if prev, ok := w.last[bk]; ok && prev != w.nodes[i].id {
						w.moved[bk]++
					}
					w.last[bk] = w.nodes[i].id
					w.mu.Unlock()
				}
			}
		}
		w.rounds.Add(1)
	}
}

// finish stops the watcher and fails t on any overlap seen.
func (w *watcher) finish(t *testing.T) (rounds int64, moved int) {
	t.Helper()
	select {
	case <-w.stop:
		return w.rounds.Load(), len(w.moved)
	default:
	}
	close(w.stop)
	<-w.done
	if v := w.violations.Load(); v > 0 {
		t.Errorf("%d overlaps seen; first: %s", v, w.first)
	}
	return w.rounds.Load(), len(w.moved)
}

// waitRounds waits until the watcher has completed n more rounds.
func (w *watcher) waitRounds(t *testing.T, n int64) {
	t.Helper()
	target := w.rounds.Load() + n
	eventually(t, 30*time.Second, "watcher rounds", func() error {
		if w.rounds.Load() < target {
			return errors.New("watcher behind")
		}
		return nil
	})
}

// TestEpochsLeasesAndExclusiveBuckets: three nodes propose and adopt an
// epoch listing all three and manage every bucket between them; a drained
// node's buckets move to the others at a new epoch; a node whose protocol
// stops (paused) while a new epoch moves its buckets keeps answering until
// its lease runs out on its own clock, and no other node takes one of its
// buckets before then. A watcher checks throughout that no two nodes
// manage a bucket at once.
func TestEpochsLeasesAndExclusiveBuckets(t *testing.T) {
	c := newTestCluster(t)
	a := c.start()
	b := c.start(a.addr)
	d := c.start(a.addr)
	nodes := []*node{a, b, d}
	w := watch(nodes)
	defer w.finish(t)

	eventually(t, 20*time.Second, "three nodes settle on one epoch", func() error { return settled(nodes, 3) })
	e3 := a.own.Status().Epoch
	w.waitRounds(t, 2)

	// Drain d: a new epoch gives its buckets to a and b.
	if err := d.mem.SetDraining(context.Background(), true); err != nil {
		t.Fatal(err)
	}
	eventually(t, 20*time.Second, "d drained", func() error {
		if err := settled(nodes, 3); err != nil {
			return err
		}
		if st := d.own.Status(); st.Managed != 0 || st.Epoch <= e3 {
			return fmt.Errorf("d manages %d buckets at epoch %d", st.Managed, st.Epoch)
		}
		return nil
	})
	w.waitRounds(t, 2)

	// Pause b's protocol (no renewal, no reads: a stopped process whose
	// sessions still run, or one cut off from the store) and drain it, so
	// that the next epoch moves its buckets to a at once: b answers until
	// its lease runs out on its own clock, and a must not take one of its
	// buckets before then.
	bHeld := b.own.Status().Managed
	if bHeld == 0 {
		t.Fatal("b manages no bucket before the pause")
	}
	var bs []uint32
	for bk := range uint32(usermap.Buckets) {
		if b.own.Manages(bk) != 0 {
			bs = append(bs, bk)
		}
	}
	// Pause just after a renewal, so that b's lease has most of its term
	// left (term - margin).
	eventually(t, 10*time.Second, "b just renewed", func() error {
		b.own.mu.Lock()
		left := time.Until(b.own.heldUntil)
		b.own.mu.Unlock()
		if left < term-term/6-40*time.Millisecond {
			return fmt.Errorf("%v left", left)
		}
		return nil
	})
	paused := time.Now()
	b.own.stopLoops()
	if err := b.mem.SetDraining(context.Background(), true); err != nil {
		t.Fatal(err)
	}
	b.own.mu.Lock()
	bUntil := b.own.heldUntil
	b.own.mu.Unlock()
	var taken time.Time
	eventually(t, 20*time.Second, "a takes b's buckets", func() error {
		if a.own.Manages(bs[0]) == 0 {
			return errors.New("not yet")
		}
		taken = time.Now()
		return nil
	})
	t.Logf("pause to a managing one of b's buckets: %v (b's own lease ran to %v after the pause; term %v)",
		taken.Sub(paused), bUntil.Sub(paused), term)
	if !taken.After(bUntil) {
		t.Errorf("a took b's bucket %v before b's lease ran out", bUntil.Sub(taken))
	}
	if b.own.Manages(bs[0]) != 0 {
		t.Error("b still answers for its bucket after its lease ran out")
	}
	// Then kill it for good: nothing changes for a.
	b.kill()
	eventually(t, 20*time.Second, "a manages every bucket", func() error {
		if n := a.own.Status().Managed; n != usermap.Buckets {
			return fmt.Errorf("a manages %d", n)
		}
		return nil
	})
	w.waitRounds(t, 2)
	rounds, moved := w.finish(t)
	t.Logf("watcher: %d rounds over %d buckets, %d buckets seen changing hands", rounds, usermap.Buckets, moved)
	if moved < len(bs) {
		t.Errorf("the watcher saw %d buckets change hands, fewer than b's %d", moved, len(bs))
	}
}

// TestAdoptionWaitsForWritesInFlight: a node that loses a bucket at a new
// epoch announces the epoch (its lease row) only after its write in flight
// on that bucket is done, and the new owner takes the bucket only then;
// meanwhile the old owner names the new one, which answers ErrHandoff.
func TestAdoptionWaitsForWritesInFlight(t *testing.T) {
	c := newTestCluster(t)
	a := c.start()
	b := c.start(a.addr)
	nodes := []*node{a, b}
	eventually(t, 20*time.Second, "two nodes settle", func() error { return settled(nodes, 2) })
	// A user of a bucket b manages.
	var user string
	for i := 0; ; i++ {
		user = fmt.Sprintf("user%d@example.test", i)
		if _, err := b.own.Epoch(user); err == nil {
			break
		}
	}
	epoch, done, err := b.own.Begin(user)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.own.Epoch(user); !errors.Is(err, ErrNotManager) {
		t.Fatalf("a's Epoch(%s) = %v, want ErrNotManager", user, err)
	}
	before := b.own.Status().Adopted
	if err := b.mem.SetDraining(context.Background(), true); err != nil {
		t.Fatal(err)
	}
	eventually(t, 20*time.Second, "a new epoch read by both, b handing over", func() error {
		for _, n := range nodes {
			if st := n.own.Status(); st.Epoch <= before {
				return fmt.Errorf("epoch %d", st.Epoch)
			}
		}
		var nm *NotManagerError
		if _, err := b.own.Epoch(user); !errors.As(err, &nm) || nm.Manager != a.id {
			return fmt.Errorf("b's Epoch(%s) = %v, want a named", user, err)
		}
		return nil
	})
	// For three lease terms, with the write still in flight, b does not
	// announce the epoch and a does not take the bucket.
	hold := time.Now().Add(3 * term)
	for time.Now().Before(hold) {
		if _, err := a.own.Epoch(user); !errors.Is(err, ErrHandoff) {
			t.Fatalf("a's Epoch(%s) with b's write in flight = %v, want ErrHandoff", user, err)
		}
		ls, err := c.st.NodeLeases(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		for _, l := range ls {
			if l.Node == b.id && l.Adopted > before {
				t.Fatalf("b announced epoch %d with its write in flight", l.Adopted)
			}
		}
		var nm *NotManagerError
		if _, err := b.own.Epoch(user); !errors.As(err, &nm) || nm.Manager != a.id {
			t.Fatalf("b's Epoch(%s) while handing over = %v, want a named", user, err)
		}
		time.Sleep(term / 6) // paces the checks of a condition that must hold throughout
	}
	if err := done(); err != nil {
		t.Fatalf("done: %v", err)
	}
	eventually(t, 20*time.Second, "a takes the bucket", func() error {
		e, err := a.own.Epoch(user)
		if err != nil {
			return err
		}
		if e <= epoch {
			return fmt.Errorf("a manages at epoch %d, not above b's %d", e, epoch)
		}
		return nil
	})
	eventually(t, 20*time.Second, "both settle", func() error { return settled(nodes, 2) })
}

// TestCloseReleases: a node closed gracefully releases its lease, so its
// buckets move without waiting for it to expire; a closed Owner answers
// ErrClosed.
func TestCloseReleases(t *testing.T) {
	c := newTestCluster(t)
	a := c.start()
	b := c.start(a.addr)
	eventually(t, 20*time.Second, "two nodes settle", func() error { return settled([]*node{a, b}, 2) })
	if err := b.own.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	if _, err := b.own.Epoch("x@example.test"); !errors.Is(err, ErrClosed) || !errors.Is(err, store.ErrUnavailable) {
		t.Fatalf("Epoch after Close = %v", err)
	}
	eventually(t, 20*time.Second, "a sees b's lease released", func() error {
		for _, ns := range a.own.Status().Nodes {
			if ns.ID == b.id && ns.Lease == LeaseReleased {
				return nil
			}
		}
		return errors.New("not released")
	})
	b.mem.Leave(context.Background())
	b.kill()
	eventually(t, 20*time.Second, "a manages every bucket", func() error {
		if n := a.own.Status().Managed; n != usermap.Buckets {
			return fmt.Errorf("a manages %d", n)
		}
		return nil
	})
}

// faultyLeases is the real store with a switch that cuts this node off
// from it: every call fails, as for a node partitioned from the store.
type faultyLeases struct {
	store.Ownership
	fail atomic.Bool
}

var errCut = fmt.Errorf("cut off from the store: %w", store.ErrUnavailable)

func (f *faultyLeases) PutNodeLease(ctx context.Context, l store.NodeLease) error {
	if f.fail.Load() {
		return errCut
	}
	return f.Ownership.PutNodeLease(ctx, l)
}

func (f *faultyLeases) NodeLeases(ctx context.Context) ([]store.NodeLease, error) {
	if f.fail.Load() {
		return nil, errCut
	}
	return f.Ownership.NodeLeases(ctx)
}

func (f *faultyLeases) LatestClusterMap(ctx context.Context) (store.ClusterMap, error) {
	if f.fail.Load() {
		return store.ClusterMap{}, errCut
	}
	return f.Ownership.LatestClusterMap(ctx)
}

func (f *faultyLeases) ProposeClusterMap(ctx context.Context, m store.ClusterMap) error {
	if f.fail.Load() {
		return errCut
	}
	return f.Ownership.ProposeClusterMap(ctx, m)
}

// TestLapseStopsAndRetakes: a node cut off from the store stops managing
// once its lease runs out on its own clock (ErrNoLease); while it is cut
// off, a new epoch (it is drained) gives its buckets to the other node,
// which takes them once the lease expired. When the node reaches the store
// again, its renewal finds the lapse: it drops everything, rereads the map
// and, drained, manages nothing, never answering for a bucket the other
// node took. Drained back into service, it takes its share afresh. A
// watcher checks exclusivity throughout.
func TestLapseStopsAndRetakes(t *testing.T) {
	c := newTestCluster(t)
	a := c.start()
	f := &faultyLeases{Ownership: c.st}
	// b: as start, over the faulty store.
	id := credentials.NewNodeID()
	creds, err := c.rec.ForNode(id, credentials.NodeOptions{})
	if err != nil {
		t.Fatal(err)
	}
	tr, err := transport.Listen(transport.Options{Addr: "127.0.0.1:0", Node: creds})
	if err != nil {
		t.Fatal(err)
	}
	mem, err := membership.Start(context.Background(), membership.Options{
		ID: id, Transport: tr, GossipKey: creds.GossipKey(), Join: []string{a.addr}, DetectionTimeout: detection,
	})
	if err != nil {
		tr.Close()
		t.Fatal(err)
	}
	own, err := Start(Options{ID: id, Store: f, Subscribe: mem.Subscribe, Term: term})
	if err != nil {
		t.Fatal(err)
	}
	b := &node{id: id, addr: tr.Addr().String(), tr: tr, mem: mem, own: own}
	t.Cleanup(func() { b.kill() })
	nodes := []*node{a, b}
	w := watch(nodes)
	defer w.finish(t)
	eventually(t, 20*time.Second, "two nodes settle", func() error { return settled(nodes, 2) })
	var user string
	for i := 0; ; i++ {
		user = fmt.Sprintf("user%d@example.test", i)
		if _, err := b.own.Epoch(user); err == nil {
			break
		}
	}
	managed := b.own.Status().Managed

	f.fail.Store(true)
	cut := time.Now()
	eventually(t, 10*time.Second, "b stops managing", func() error {
		if _, err := b.own.Epoch(user); !errors.Is(err, ErrNoLease) {
			return fmt.Errorf("Epoch = %v", err)
		}
		return nil
	})
	if lapsed := time.Since(cut); lapsed > term {
		t.Errorf("b answered %v after its lease writes failed; its lease lasts at most %v", lapsed, term-term/6)
	}
	if st := b.own.Status(); st.Managed != 0 {
		t.Fatalf("b manages %d buckets with its lease lapsed", st.Managed)
	}
	// Drained while cut off: a takes b's buckets once b's lease expired.
	if err := b.mem.SetDraining(context.Background(), true); err != nil {
		t.Fatal(err)
	}
	eventually(t, 20*time.Second, "a manages every bucket", func() error {
		if n := a.own.Status().Managed; n != usermap.Buckets {
			return fmt.Errorf("a manages %d", n)
		}
		return nil
	})
	w.waitRounds(t, 2)

	f.fail.Store(false)
	eventually(t, 20*time.Second, "b adopts the epoch that drained it", func() error {
		if st, ast := b.own.Status(), a.own.Status(); st.Adopted != ast.Adopted || st.Managed != 0 {
			return fmt.Errorf("b adopted %d, manages %d; a adopted %d", st.Adopted, st.Managed, ast.Adopted)
		}
		return nil
	})
	w.waitRounds(t, 3)
	if err := b.mem.SetDraining(context.Background(), false); err != nil {
		t.Fatal(err)
	}
	eventually(t, 20*time.Second, "b takes its share again", func() error {
		if n := b.own.Status().Managed; n < managed*9/10 {
			return fmt.Errorf("b manages %d (had %d)", n, managed)
		}
		return settled(nodes, 2)
	})
	w.waitRounds(t, 2)
}

// viewNode is an Owner whose live set the test sets, as memberlist
// would publish it: the views of different nodes can disagree, as they
// do during and after a partition.
type viewNode struct {
	id    string
	own   *Owner
	st    *faultyLeases
	views chan membership.View
}

func (c *testCluster) startViewNode(id string) *viewNode {
	c.t.Helper()
	n := &viewNode{id: id, st: &faultyLeases{Ownership: c.st}, views: make(chan membership.View, 1)}
	sub := func() (<-chan membership.View, func()) { return n.views, func() {} }
	own, err := Start(Options{ID: id, Store: n.st, Subscribe: sub, Term: term})
	if err != nil {
		c.t.Fatal(err)
	}
	n.own = own
	c.t.Cleanup(func() { own.stopLoops() })
	return n
}

// see publishes a view listing ids, each in service.
func (n *viewNode) see(ids ...string) {
	w := map[string]uint32{}
	for _, id := range ids {
		w[id] = membership.DefaultWeight
	}
	n.seeWeights(w)
}

// seeWeights publishes a view listing the nodes of weights, with theirs.
func (n *viewNode) seeWeights(weights map[string]uint32) {
	v := membership.View{}
	for id, w := range weights {
		v.Members = append(v.Members, membership.Member{ID: id, State: membership.Alive,
			Meta: membership.Meta{Weight: w}})
	}
	slices.SortFunc(v.Members, func(a, b membership.Member) int { return cmpString(a.ID, b.ID) })
	select { // replace an unread view, as Membership.Subscribe does
	case <-n.views:
	default:
	}
	n.views <- v
}

// stableAt waits until every node in nodes has adopted one epoch that
// lists exactly members, then until every node's lease row was renewed
// six more times (two lease terms, in which any node waiting to propose
// would have), and fails t if the newest epoch moved meanwhile.
func stableAt(t *testing.T, st store.Ownership, nodes []*viewNode, members ...string) {
	t.Helper()
	w := map[string]uint32{}
	for _, id := range members {
		w[id] = membership.DefaultWeight
	}
	stableWeights(t, st, nodes, w)
}

// stableWeights is stableAt for members of the given weights.
func stableWeights(t *testing.T, st store.Ownership, nodes []*viewNode, weights map[string]uint32) {
	t.Helper()
	var members []string
	for id := range weights {
		members = append(members, id)
	}
	slices.Sort(members)
	var epoch uint64
	eventually(t, 20*time.Second, fmt.Sprintf("one epoch listing %d members", len(members)), func() error {
		cm, err := st.LatestClusterMap(context.Background())
		if err != nil {
			return err
		}
		var ids []string
		for _, m := range cm.Members {
			ids = append(ids, m.ID)
			if m.Weight != weights[m.ID] {
				return fmt.Errorf("epoch %d gives %s weight %d", cm.Epoch, m.ID, m.Weight)
			}
		}
		if !slices.Equal(ids, members) {
			return fmt.Errorf("epoch %d lists %v", cm.Epoch, ids)
		}
		for _, n := range nodes {
			if a := n.own.Status().Adopted; a != cm.Epoch {
				return fmt.Errorf("%s adopted %d of %d", n.id, a, cm.Epoch)
			}
		}
		epoch = cm.Epoch
		return nil
	})
	renewals := func() map[string]uint64 {
		ls, err := st.NodeLeases(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		r := map[string]uint64{}
		for _, l := range ls {
			r[l.Node] = l.Renewal
		}
		return r
	}
	before := renewals()
	eventually(t, 20*time.Second, "six renewals of every live node", func() error {
		now := renewals()
		for _, id := range members {
			if now[id] < before[id]+6 {
				return fmt.Errorf("%s renewed %d times", id, now[id]-before[id])
			}
		}
		return nil
	})
	cm, err := st.LatestClusterMap(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if cm.Epoch != epoch {
		t.Fatalf("the epoch moved from %d to %d with the live set unchanged: the nodes keep proposing", epoch, cm.Epoch)
	}
}

// TestDivergentViewsConverge: three nodes that all renew their leases,
// but whose membership views disagree (a and b each miss the other, as
// after a partition that memberlist has not healed yet), agree on one
// map listing all three, and stop proposing. Each node counts a node its
// view misses as live while its lease row is renewed: every node reads
// the same rows.
func TestDivergentViewsConverge(t *testing.T) {
	c := newTestCluster(t)
	a, b, d := c.startViewNode("node-a"), c.startViewNode("node-b"), c.startViewNode("node-d")
	nodes := []*viewNode{a, b, d}
	for _, n := range nodes {
		n.see("node-a", "node-b", "node-d")
	}
	stableAt(t, c.st, nodes, "node-a", "node-b", "node-d")
	a.see("node-a", "node-d")
	b.see("node-b", "node-d")
	stableAt(t, c.st, nodes, "node-a", "node-b", "node-d")
}

// TestViewWithoutStoreExcluded: a node cut off from the store but still
// in one node's view (gossip reaches it) is left out of the map by every
// node once its lease expired, and the nodes stop proposing; when it
// renews again it is back in.
func TestViewWithoutStoreExcluded(t *testing.T) {
	c := newTestCluster(t)
	a, b, x := c.startViewNode("node-a"), c.startViewNode("node-b"), c.startViewNode("node-x")
	all := []*viewNode{a, b, x}
	for _, n := range all {
		n.see("node-a", "node-b", "node-x")
	}
	stableAt(t, c.st, all, "node-a", "node-b", "node-x")
	x.st.fail.Store(true)
	b.see("node-a", "node-b")
	stableAt(t, c.st, []*viewNode{a, b}, "node-a", "node-b")
	x.st.fail.Store(false)
	b.see("node-a", "node-b", "node-x")
	stableAt(t, c.st, all, "node-a", "node-b", "node-x")
}

// TestIsolatedNodeStepsAside: a node cut off from its peers but not from
// the store (its view lists only itself, theirs miss it) stops renewing its
// lease and proposing; the other two agree on a map without it and take its
// buckets, and it manages nothing. Without that, every node counts it live
// while its row is renewed, the map keeps it, and the requests forwarded to
// its buckets fail until the partition heals. Once it reaches them again it
// is back in. A node whose peers are dead (their rows no longer renewed) is
// not cut off: it takes every bucket.
func TestIsolatedNodeStepsAside(t *testing.T) {
	c := newTestCluster(t)
	a, b, x := c.startViewNode("node-a"), c.startViewNode("node-b"), c.startViewNode("node-x")
	all := []*viewNode{a, b, x}
	for _, n := range all {
		n.see("node-a", "node-b", "node-x")
	}
	stableAt(t, c.st, all, "node-a", "node-b", "node-x")

	x.see("node-x")
	a.see("node-a", "node-b")
	b.see("node-a", "node-b")
	stableAt(t, c.st, []*viewNode{a, b}, "node-a", "node-b")
	managedBy := func(want map[*viewNode]bool) func() error {
		return func() error {
			total := 0
			for _, n := range all {
				st := n.own.Status()
				if want[n] != (st.Managed > 0) {
					return fmt.Errorf("%s manages %d buckets (isolated %v)", n.id, st.Managed, st.Isolated)
				}
				total += st.Managed
			}
			if total != usermap.Buckets {
				return fmt.Errorf("%d buckets managed, want %d", total, usermap.Buckets)
			}
			return nil
		}
	}
	eventually(t, 20*time.Second, "a and b manage every bucket, x none", managedBy(map[*viewNode]bool{a: true, b: true}))
	if !x.own.Status().Isolated {
		t.Error("x does not report itself isolated")
	}

	for _, n := range all {
		n.see("node-a", "node-b", "node-x")
	}
	stableAt(t, c.st, all, "node-a", "node-b", "node-x")
	eventually(t, 20*time.Second, "every node manages buckets again", managedBy(map[*viewNode]bool{a: true, b: true, x: true}))

	a.own.stopLoops()
	b.own.stopLoops()
	x.see("node-x")
	stableAt(t, c.st, []*viewNode{x}, "node-x")
	eventually(t, 20*time.Second, "x manages every bucket", managedBy(map[*viewNode]bool{x: true}))
}

// TestWeightMovesBuckets: a node that lowers its weight (a node under
// sustained overload does: internal/cluster, balance.go) gets a share of
// buckets in proportion at the next epoch, and its full share back when
// it raises it again.
func TestWeightMovesBuckets(t *testing.T) {
	c := newTestCluster(t)
	a, b, x := c.startViewNode("node-a"), c.startViewNode("node-b"), c.startViewNode("node-x")
	all := []*viewNode{a, b, x}
	share := func(w uint32) map[string]int {
		weights := map[string]uint32{"node-a": membership.DefaultWeight, "node-b": membership.DefaultWeight, "node-x": w}
		for _, n := range all {
			n.seeWeights(weights)
		}
		stableWeights(t, c.st, all, weights)
		got := map[string]int{}
		eventually(t, 20*time.Second, "every bucket managed", func() error {
			total := 0
			for _, n := range all {
				got[n.id] = n.own.Status().Managed
				total += got[n.id]
			}
			if total != usermap.Buckets {
				return fmt.Errorf("%d buckets managed", total)
			}
			return nil
		})
		return got
	}
	full := share(membership.DefaultWeight)
	half := share(membership.DefaultWeight / 2)
	// Weights 100:100:50 give node-x a fifth of the buckets.
	if want := usermap.Buckets / 5; half["node-x"] < want-2 || half["node-x"] > want+2 {
		t.Fatalf("at half weight node-x manages %d buckets, want about %d (at full weight %d)", half["node-x"], want, full["node-x"])
	}
	back := share(membership.DefaultWeight)
	if back["node-x"] < usermap.Buckets/3-2 {
		t.Fatalf("back at full weight node-x manages %d buckets", back["node-x"])
	}
}

// TestOldMapsPruned: once the lowest epoch a lease row names has risen
// pruneEvery epochs, the maps more than pruneKeep below it are deleted,
// also after the last epoch (the slowest node catching up prunes), and the
// nodes go on settling on new epochs.
func TestOldMapsPruned(t *testing.T) {
	c := newTestCluster(t)
	a, b := c.startViewNode("node-a"), c.startViewNode("node-b")
	all := []*viewNode{a, b}
	for _, n := range all {
		n.own.mu.Lock()
		n.own.pruneEvery, n.own.pruneKeep = 2, 1
		n.own.mu.Unlock()
	}
	weights := []uint32{membership.DefaultWeight, membership.DefaultWeight / 2}
	for i := range 6 {
		w := map[string]uint32{"node-a": membership.DefaultWeight, "node-b": weights[i%2]}
		for _, n := range all {
			n.seeWeights(w)
		}
		stableWeights(t, c.st, all, w)
	}
	latest, err := c.st.LatestClusterMap(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, "early maps pruned", func() error {
		for e := uint64(1); e < latest.Epoch-2; e++ {
			if _, err := c.st.ClusterMapAt(context.Background(), e); !errors.Is(err, store.ErrNotFound) {
				return fmt.Errorf("epoch %d of %d: %v", e, latest.Epoch, err)
			}
		}
		return nil
	})
	if _, err := c.st.ClusterMapAt(context.Background(), latest.Epoch-1); err != nil {
		t.Fatalf("the epoch below the newest, within the margin: %v", err)
	}
}
