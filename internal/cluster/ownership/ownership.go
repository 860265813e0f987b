// Package ownership runs the cluster's ownership protocol on one node
// (docs/adr/0024, with the choices of docs/adr/0027): which buckets of the
// user map this node manages now, and under which fencing epoch.
//
// The store (store.Ownership) holds the map epochs, each a membership that
// the user map is a pure function of, and one lease row per node. An Owner:
//
//   - proposes the next epoch, with one conditional write, when the live
//     set membership reports differs from the latest map's members (the
//     lowest live ID of that map does so after the difference has lasted
//     term/3; any node after 2 terms);
//   - renews its lease every term/3 with an ordinary write of its row
//     (adopted epoch, a renewal counter); it holds the lease until
//     t_send + term - margin on its own monotonic clock, t_send being when
//     it sent its last renewal that succeeded (margin = term/6);
//   - reads every lease row every term/6; another node's lease is expired
//     once a read that began term + margin after this node first saw the
//     row's current value still returns that value (or the row says
//     Released);
//   - adopts each newer epoch it reads: it stops managing the buckets it
//     does not keep, waits for its writes in flight on them (Begin/done),
//     writes its lease with the new epoch, and only then takes the buckets
//     it gains, each once no other node that owned it under that node's
//     adopted epoch can still manage it (the node adopted the new epoch or
//     its lease expired), judged on a lease read that began after its own
//     lease write;
//   - answers Epoch and Begin for the user manager and the forwarder.
//
// Invariant (what the tests watch): at no moment do two nodes both answer
// Epoch for one bucket, given clocks whose rates agree within the margin.
// A bucket is kept across an epoch change without interruption only when
// this node owned it under the epoch just before; after a lapse of its own
// lease a node renews, rereads the map and takes every bucket afresh.
package ownership

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"quill/internal/cluster/membership"
	"quill/internal/cluster/usermap"
	"quill/internal/store"
)

// DefaultTerm is the lease term (ADR 0024).
const DefaultTerm = 3 * time.Second

// Errors of Epoch and Begin. ErrHandoff and ErrNoLease wrap
// store.ErrUnavailable: they are temporary, and callers answer them with
// a temporary failure or retry.
var (
	// ErrNotManager: another node manages the user (NotManagerError
	// names it).
	ErrNotManager = errors.New("ownership: this node does not manage the user")
	// ErrHandoff: the user's bucket is changing hands to this node, or
	// this node has not adopted the newest epoch yet.
	ErrHandoff = fmt.Errorf("ownership: bucket in handoff: %w", store.ErrUnavailable)
	// ErrNoLease: this node's lease is not held (renewals failing), so it
	// manages nothing until it holds one again.
	ErrNoLease = fmt.Errorf("ownership: this node's lease is not held: %w", store.ErrUnavailable)
	// ErrClosed: the Owner was closed.
	ErrClosed = fmt.Errorf("ownership: stopped: %w", store.ErrUnavailable)
)

// NotManagerError says which node manages a user, as of the newest map
// this node knows (Epoch). errors.Is(err, ErrNotManager) holds.
type NotManagerError struct {
	Manager string
	Epoch   uint64
}

func (e *NotManagerError) Error() string {
	return fmt.Sprintf("ownership: node %s manages the user at epoch %d", e.Manager, e.Epoch)
}

// Is makes errors.Is(err, ErrNotManager) hold.
func (e *NotManagerError) Is(target error) bool { return target == ErrNotManager }

// Options configure Start.
type Options struct {
	// ID is this node's ID.
	ID string
	// Store holds the map epochs and lease rows.
	Store store.Ownership
	// Subscribe delivers the live set at each change
	// (membership.Membership.Subscribe).
	Subscribe func() (<-chan membership.View, func())
	// Term is the lease term (default DefaultTerm); the margin is Term/6.
	Term       time.Duration
	Logger     *slog.Logger
	Registerer prometheus.Registerer // may be nil
}

// Owner is this node's part of the ownership protocol. Its methods are
// safe for concurrent use.
type Owner struct {
	id     string
	st     store.Ownership
	term   time.Duration
	margin time.Duration
	log    *slog.Logger
	m      *metrics

	// leaseMu orders this node's lease writes, so that the row only moves
	// forward (renewal counter, adopted epoch).
	leaseMu sync.Mutex

	mu   sync.Mutex
	cond *sync.Cond // on mu: an in-flight count dropped, or closing
	// Guarded by mu:
	heldUntil time.Time // own lease held before this instant
	renewal   uint64    // the last renewal counter written
	lapsed    bool      // managed nothing since the lease lapsed: adopt afresh
	adopted   uint64    // epoch adopted (written in the lease row)
	cur       *usermap.Map
	latest    store.ClusterMap // newest map read
	latestMap *usermap.Map
	// adoptWritten is when the lease write announcing adopted completed:
	// handoffs are judged on lease reads that began after it.
	adoptWritten time.Time
	managed      [usermap.Buckets]uint64 // epoch the bucket is managed at; 0: not managed
	pending      [usermap.Buckets]bool   // owned at adopted, awaiting handoff
	inflight     [usermap.Buckets]int32  // Begin calls not yet done
	maps         map[uint64]*usermap.Map // computed maps of past epochs, immutable
	peers        map[string]*peer        // other nodes' lease rows as observed
	diffSince    time.Time               // when the live set first differed from latest
	// isolated: this node's view reaches only a minority of the nodes
	// the store hears from (isolatedLocked); it neither renews its
	// lease nor proposes, so that the majority takes its buckets.
	isolated bool
	closed   bool
	// pruned is the floor (the lowest epoch lease rows name) at the last
	// pruning of old maps (pruneOld); pruneEvery and pruneKeep its period
	// and margin.
	pruned                uint64
	pruneEvery, pruneKeep uint64

	stop chan struct{}
	wg   sync.WaitGroup
	once sync.Once
}

// peer is another node's lease row as this node observes it.
type peer struct {
	lease store.NodeLease
	// seen is when a read first returned lease (its completion);
	// lastRead when the latest read that returned it began.
	seen, lastRead time.Time
}

// Start starts the protocol: the lease renewal and the loop that reads
// leases and maps, adopts epochs, hands buckets over and proposes epochs.
// It returns at once; the node manages buckets once its lease is written
// and an epoch adopted.
func Start(opts Options) (*Owner, error) {
	if opts.ID == "" || opts.Store == nil || opts.Subscribe == nil {
		return nil, errors.New("ownership: no ID, store or membership")
	}
	if opts.Term <= 0 {
		opts.Term = DefaultTerm
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	o := &Owner{id: opts.ID, st: opts.Store, term: opts.Term, margin: opts.Term / 6, log: opts.Logger,
		lapsed: true, maps: map[uint64]*usermap.Map{}, peers: map[string]*peer{}, stop: make(chan struct{}),
		pruneEvery: 100, pruneKeep: 100,
		// The renewal counter starts at the wall clock, so that a
		// restarted node's first row differs from its last one.
		renewal: uint64(time.Now().UnixNano())}
	o.cond = sync.NewCond(&o.mu)
	m, err := newMetrics(opts.Registerer, o)
	if err != nil {
		return nil, err
	}
	o.m = m
	views, cancel := opts.Subscribe()
	o.wg.Add(2)
	go o.renewLoop()
	go o.mainLoop(views, cancel)
	return o, nil
}

// ID returns this node's ID.
func (o *Owner) ID() string { return o.id }

// Term returns the lease term.
func (o *Owner) Term() time.Duration { return o.term }

// Epoch implements usermgr.Owner: the epoch under which this node manages
// user's bucket now, or an error: NotManagerError when another node does,
// ErrHandoff or ErrNoLease (temporary) otherwise.
func (o *Owner) Epoch(user string) (uint64, error) {
	b := usermap.Bucket(user)
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.epochLocked(b, time.Now())
}

func (o *Owner) epochLocked(b uint32, now time.Time) (uint64, error) {
	switch {
	case o.closed:
		return 0, ErrClosed
	case !now.Before(o.heldUntil):
		return 0, ErrNoLease
	case o.managed[b] != 0:
		return o.managed[b], nil
	case o.pending[b] || o.latestMap == nil:
		return 0, ErrHandoff
	}
	owner := string(o.latestMap.Owner(b))
	if owner == o.id {
		return 0, ErrHandoff // gained in an epoch not adopted yet
	}
	return 0, &NotManagerError{Manager: owner, Epoch: o.latest.Epoch}
}

// Begin is Epoch for a write about to be made: on success the write counts
// as in flight on user's bucket until done is called, and an adoption that
// takes the bucket away waits for it before announcing the new epoch.
// done returns ErrNoLease when the lease was not held when the write
// completed: the write must then not be acknowledged (ADR 0024).
func (o *Owner) Begin(user string) (epoch uint64, done func() error, err error) {
	b := usermap.Bucket(user)
	o.mu.Lock()
	defer o.mu.Unlock()
	epoch, err = o.epochLocked(b, time.Now())
	if err != nil {
		return 0, nil, err
	}
	o.inflight[b]++
	var once sync.Once
	return epoch, func() error {
		var held bool
		once.Do(func() {
			o.mu.Lock()
			o.inflight[b]--
			if o.inflight[b] == 0 {
				o.cond.Broadcast()
			}
			held = time.Now().Before(o.heldUntil)
			o.mu.Unlock()
		})
		if !held {
			return ErrNoLease
		}
		return nil
	}, nil
}

// Manages reports the epoch at which this node manages bucket b now (0:
// it does not).
func (o *Owner) Manages(b uint32) uint64 {
	o.mu.Lock()
	defer o.mu.Unlock()
	e, err := o.epochLocked(b, time.Now())
	if err != nil {
		return 0
	}
	return e
}

// renewLoop renews the lease every term/3, measured from each renewal's
// sending.
func (o *Owner) renewLoop() {
	defer o.wg.Done()
	for {
		sent := time.Now()
		o.renew()
		wait := o.term/3 - time.Since(sent)
		select {
		case <-o.stop:
			return
		case <-time.After(max(wait, 0)):
		}
	}
}

// renew writes the lease row with the adopted epoch. A renewal sent when
// the lease was no longer held ends every management of this node (a
// lapse): it adopts afresh once the main loop has reread the map.
func (o *Owner) renew() {
	o.leaseMu.Lock()
	defer o.leaseMu.Unlock()
	o.mu.Lock()
	if o.isolated {
		o.mu.Unlock()
		o.m.renewals.WithLabelValues("isolated").Inc()
		return
	}
	o.renewal++
	l := store.NodeLease{Node: o.id, Adopted: o.adopted, Renewal: o.renewal}
	o.mu.Unlock()
	sent, err := o.putLease(l)
	o.mu.Lock()
	defer o.mu.Unlock()
	if err != nil {
		o.m.renewals.WithLabelValues("error").Inc()
		if !time.Now().Before(o.heldUntil) && !o.lapsed {
			o.log.Warn("cluster: lease lapsed: this node manages nothing until it renews", "err", err)
		}
		return
	}
	o.m.renewals.WithLabelValues("ok").Inc()
	if !sent.Before(o.heldUntil) && !o.lapsed {
		// Not held when sent: another node may have taken our buckets.
		o.log.Warn("cluster: lease had lapsed; taking buckets afresh")
		o.dropAllLocked()
		o.lapsed = true
	}
	if until := sent.Add(o.term - o.margin); until.After(o.heldUntil) {
		o.heldUntil = until
	}
}

// putLease writes l, bounded by the time the lease could still be held,
// and returns when it was sent. The caller holds leaseMu.
func (o *Owner) putLease(l store.NodeLease) (time.Time, error) {
	ctx, cancel := context.WithTimeout(context.Background(), o.term-o.margin)
	defer cancel()
	sent := time.Now()
	return sent, o.st.PutNodeLease(ctx, l)
}

// dropAllLocked stops managing every bucket.
func (o *Owner) dropAllLocked() {
	lost := 0
	for b := range o.managed {
		if o.managed[b] != 0 {
			lost++
		}
		o.managed[b], o.pending[b] = 0, false
	}
	o.m.moves.WithLabelValues("lost").Add(float64(lost))
}

// mainLoop reads leases and maps every term/6, and at every change of the
// live set considers proposing an epoch.
func (o *Owner) mainLoop(views <-chan membership.View, cancel func()) {
	defer o.wg.Done()
	defer cancel()
	tick := time.NewTicker(o.term / 6)
	defer tick.Stop()
	var view membership.View
	for {
		select {
		case <-o.stop:
			return
		case v, ok := <-views:
			if !ok {
				views = nil
				continue
			}
			view = v
		case <-tick.C:
		}
		o.step(view)
	}
}

// step is one round of the main loop.
func (o *Owner) step(view membership.View) {
	ctx, cancel := context.WithTimeout(context.Background(), o.term)
	defer cancel()
	o.mu.Lock()
	lapsed := o.lapsed && time.Now().Before(o.heldUntil)
	o.mu.Unlock()
	// Read leases first, then the map: a newer epoch one shows is then
	// in the map read after it.
	readStart := time.Now()
	leases, lerr := o.st.NodeLeases(ctx)
	if lerr == nil {
		o.observe(leases, readStart)
	} else {
		o.log.Warn("cluster: reading node leases", "err", lerr)
	}
	cm, err := o.st.LatestClusterMap(ctx)
	switch {
	case errors.Is(err, store.ErrNotFound):
	case err != nil:
		o.log.Warn("cluster: reading the cluster map", "err", err)
	default:
		o.install(cm)
	}
	o.mu.Lock()
	latest, adopted := o.latestMap, o.adopted
	o.mu.Unlock()
	// After a lapse the map read above began after the renewal that ended
	// it, so it is at least the epoch any successor acted on.
	if latest != nil && err == nil && (lapsed || latest.Epoch() > adopted) {
		o.adopt(ctx, latest, lapsed)
	}
	if lerr == nil {
		o.handoff(ctx, readStart)
		o.pruneOld(ctx)
		o.checkIsolated(view)
	}
	o.propose(ctx, view)
}

// checkIsolated sets isolated from view and the lease rows last read, and
// logs a change.
func (o *Owner) checkIsolated(view membership.View) {
	o.mu.Lock()
	defer o.mu.Unlock()
	was := o.isolated
	isolated, reached, alive := o.isolatedLocked(view)
	o.isolated = isolated
	switch {
	case o.isolated && !was:
		o.log.Warn("cluster: cut off from most of the cluster: not renewing the lease, so that the others take this node's buckets",
			"reached", reached, "alive", alive)
	case !o.isolated && was:
		o.log.Info("cluster: in touch with the cluster again: renewing the lease", "reached", reached, "alive", alive)
	}
	if o.isolated {
		o.m.isolated.Set(1)
	} else {
		o.m.isolated.Set(0)
	}
}

// isolatedLocked reports whether view reaches at most a minority of the
// alive nodes of the newest map, where alive means this node and every
// other whose lease row is being renewed (renewingLocked): the store hears
// from them, so they are up, and this node, unable to reach them, can
// neither forward to them nor be forwarded to. An isolated node stops
// renewing its lease and proposing, its lease expires, and the nodes on
// the majority side take its buckets (without this, every node counts a
// node whose row is renewed as live, and the requests forwarded to it
// would fail until the partition heals). A node whose peers are dead is
// not isolated: their rows stop changing. An even split isolates neither
// side (2·reached = alive): each keeps its buckets, as before. reached and
// alive are the counts.
func (o *Owner) isolatedLocked(view membership.View) (isolated bool, reached, alive int) {
	if o.latest.Epoch == 0 || len(view.Members) == 0 {
		return false, 0, 0
	}
	inView := make(map[string]bool, len(view.Members))
	for _, m := range view.Members {
		inView[m.ID] = true
	}
	reached, alive = 1, 1 // this node
	for _, m := range o.latest.Members {
		if p := o.peers[m.ID]; m.ID != o.id && p != nil && o.renewingLocked(p) {
			alive++
			if inView[m.ID] {
				reached++
			}
		}
	}
	return 2*reached < alive, reached, alive
}

// pruneOld deletes the maps of the epochs more than pruneKeep below the
// lowest epoch any lease row names (this node's included), each time that
// floor has risen pruneEvery epochs since the last pruning: the handoff
// reads the maps of the epochs rows name, and proposals go above the
// newest, so nothing reads a pruned map again. Gating on the floor, not on
// this node's epoch, prunes once the slowest node catches up, even if no
// epoch follows. Every node does it; the deletions are idempotent.
func (o *Owner) pruneOld(ctx context.Context) {
	o.mu.Lock()
	floor := o.adopted
	for _, p := range o.peers {
		if a := p.lease.Adopted; a > 0 {
			floor = min(floor, a)
		}
	}
	due := floor >= o.pruned+o.pruneEvery && floor > o.pruneKeep+1
	below := floor - o.pruneKeep
	o.mu.Unlock()
	if !due {
		return
	}
	if err := o.st.PruneClusterMaps(ctx, below); err != nil {
		o.log.Warn("cluster: pruning old cluster maps", "below", below, "err", err)
		return
	}
	o.mu.Lock()
	o.pruned = floor
	for e := range o.maps {
		if e < below {
			delete(o.maps, e)
		}
	}
	o.mu.Unlock()
	o.log.Info("cluster: old cluster maps pruned", "below", below)
}

// install records cm as the newest map when it is.
func (o *Owner) install(cm store.ClusterMap) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if cm.Epoch <= o.latest.Epoch {
		return
	}
	um, err := o.mapLocked(cm)
	if err != nil {
		o.log.Error("cluster: a cluster map without an eligible member", "epoch", cm.Epoch, "err", err)
		return
	}
	o.latest, o.latestMap = cm, um
	o.m.latest.Set(float64(cm.Epoch))
}

// mapLocked returns the user map of cm, computed once per epoch.
func (o *Owner) mapLocked(cm store.ClusterMap) (*usermap.Map, error) {
	if um := o.maps[cm.Epoch]; um != nil {
		return um, nil
	}
	ms := make([]usermap.Member, len(cm.Members))
	for i, m := range cm.Members {
		ms[i] = usermap.Member{ID: usermap.NodeID(m.ID), Weight: m.Weight, Draining: m.Draining}
	}
	um, err := usermap.New(cm.Epoch, ms)
	if err != nil {
		return nil, err
	}
	o.maps[cm.Epoch] = um
	return um, nil
}

// mapAt returns the user map of epoch, from memory or the store.
func (o *Owner) mapAt(ctx context.Context, epoch uint64) (*usermap.Map, error) {
	o.mu.Lock()
	um := o.maps[epoch]
	o.mu.Unlock()
	if um != nil {
		return um, nil
	}
	cm, err := o.st.ClusterMapAt(ctx, epoch)
	if err != nil {
		return nil, err
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.mapLocked(cm)
}

// observe records the lease rows a read returned; the read began at
// start.
func (o *Owner) observe(leases []store.NodeLease, start time.Time) {
	now := time.Now()
	o.mu.Lock()
	defer o.mu.Unlock()
	present := make(map[string]bool, len(leases))
	for _, l := range leases {
		if l.Node == o.id {
			continue
		}
		present[l.Node] = true
		p := o.peers[l.Node]
		if p == nil || p.lease != l {
			o.peers[l.Node] = &peer{lease: l, seen: now, lastRead: start}
			continue
		}
		p.lastRead = start
	}
	for id := range o.peers {
		if !present[id] {
			delete(o.peers, id) // gone from the store: it manages nothing
		}
	}
}

// expiredLocked reports whether p's lease can no longer be held.
func (o *Owner) expiredLocked(p *peer) bool {
	return p.lease.Released || p.lastRead.Sub(p.seen) >= o.term+o.margin
}

// adopt adopts the epoch of um. fresh (after a lapse) takes every bucket
// anew, even those this node owned under the epoch before.
func (o *Owner) adopt(ctx context.Context, um *usermap.Map, fresh bool) {
	e := um.Epoch()
	self := usermap.NodeID(o.id)
	o.mu.Lock()
	continuous := !fresh && o.cur != nil && o.cur.Epoch()+1 == e
	var lost []uint32
	keep := 0
	for b := range uint32(usermap.Buckets) {
		if continuous && o.managed[b] != 0 && um.Owner(b) == self {
			keep++
			continue
		}
		if o.managed[b] != 0 {
			lost = append(lost, b)
		}
		o.managed[b], o.pending[b] = 0, false
	}
	o.m.moves.WithLabelValues("lost").Add(float64(len(lost)))
	// Wait for the writes in flight on every bucket not kept: they began
	// under the old epoch, and the new owner must not start before them.
	for !o.closed {
		busy := false
		for b := range uint32(usermap.Buckets) {
			if o.inflight[b] > 0 && o.managed[b] == 0 {
				busy = true
				break
			}
		}
		if !busy {
			break
		}
		o.cond.Wait()
	}
	if o.closed {
		o.mu.Unlock()
		return
	}
	o.mu.Unlock()

	o.leaseMu.Lock()
	o.mu.Lock()
	o.renewal++
	l := store.NodeLease{Node: o.id, Adopted: e, Renewal: o.renewal}
	o.mu.Unlock()
	sent, err := o.putLease(l)
	o.mu.Lock()
	defer o.leaseMu.Unlock()
	defer o.mu.Unlock()
	if err != nil {
		// The buckets not kept stay stopped; the next step tries again.
		o.log.Warn("cluster: announcing the adoption of an epoch", "epoch", e, "err", err)
		return
	}
	if !sent.Before(o.heldUntil) {
		// The lease had lapsed when this write was sent (the wait for the
		// writes in flight, or renewals failing, outlasted it): others may
		// have taken even the buckets kept. As in renew: drop everything,
		// and adopt afresh after this write, which renewed the lease.
		if !o.lapsed {
			o.log.Warn("cluster: lease had lapsed while adopting; taking buckets afresh", "epoch", e)
		}
		o.dropAllLocked()
		o.lapsed = true
		o.heldUntil = sent.Add(o.term - o.margin)
		return
	}
	if until := sent.Add(o.term - o.margin); until.After(o.heldUntil) {
		o.heldUntil = until
	}
	o.adopted, o.cur, o.adoptWritten, o.lapsed = e, um, time.Now(), false
	gained := 0
	for _, b := range um.Buckets(self) {
		if o.managed[b] == 0 {
			o.pending[b] = true
			gained++
		}
	}
	o.m.adopted.Set(float64(e))
	o.log.Info("cluster: epoch adopted", "epoch", e, "kept", keep, "lost", len(lost), "to_take", gained, "fresh", fresh)
}

// handoff takes the pending buckets whose previous owners can no longer
// manage them, judged on the lease read that began at readStart.
func (o *Owner) handoff(ctx context.Context, readStart time.Time) {
	o.mu.Lock()
	e := o.adopted
	if !slices.Contains(o.pending[:], true) || !readStart.After(o.adoptWritten) {
		o.mu.Unlock()
		return
	}
	type blocker struct {
		id      string
		adopted uint64
	}
	var blockers []blocker
	for id, p := range o.peers {
		switch {
		case p.lease.Adopted > e:
			// A newer epoch exists: adopt it before taking anything.
			o.mu.Unlock()
			return
		case o.expiredLocked(p) || p.lease.Adopted == e || p.lease.Adopted == 0:
		default:
			blockers = append(blockers, blocker{id, p.lease.Adopted})
		}
	}
	o.mu.Unlock()
	var blocked [usermap.Buckets]bool
	for _, bl := range blockers {
		um, err := o.mapAt(ctx, bl.adopted)
		if errors.Is(err, store.ErrNotFound) {
			continue // a map that never was: the node manages nothing under it
		}
		if err != nil {
			o.log.Warn("cluster: reading a past cluster map", "epoch", bl.adopted, "err", err)
			return
		}
		for _, b := range um.Buckets(usermap.NodeID(bl.id)) {
			blocked[b] = true
		}
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.adopted != e || o.closed {
		return
	}
	taken, waiting := 0, 0
	for b := range o.pending {
		if !o.pending[b] {
			continue
		}
		if blocked[b] {
			waiting++
			continue
		}
		o.pending[b], o.managed[b] = false, e
		taken++
	}
	if taken > 0 {
		o.m.moves.WithLabelValues("gained").Add(float64(taken))
		o.log.Info("cluster: buckets taken", "epoch", e, "taken", taken, "waiting", waiting)
	}
}

// propose proposes the next epoch when the live set differs from the
// newest map's members: after term/3 when this node has the lowest ID
// among the map's live members in service (or among all when no map
// exists), after two terms otherwise, so that one node proposes in the
// common case and any node does when that one cannot.
//
// The live set joins this node's membership view with the lease rows,
// which every node reads alike, so that nodes whose views disagree (a
// partition memberlist has not healed) still want the same map instead of
// taking turns proposing their own (liveLocked).
func (o *Owner) propose(ctx context.Context, view membership.View) {
	if len(view.Members) == 0 {
		return
	}
	now := time.Now()
	o.mu.Lock()
	if o.isolated {
		o.diffSince = time.Time{}
		o.mu.Unlock()
		return
	}
	latest := o.latest
	want := o.liveLocked(view, latest)
	eligible := slices.ContainsFunc(want, func(m store.MapMember) bool { return m.Weight > 0 && !m.Draining })
	if latest.Epoch != 0 && slices.Equal(latest.Members, want) || !eligible {
		o.diffSince = time.Time{}
		o.mu.Unlock()
		return
	}
	if o.diffSince.IsZero() {
		o.diffSince = now
	}
	waited := now.Sub(o.diffSince)
	o.mu.Unlock()
	// The proposer of choice: the lowest ID among the live members that
	// are in the newest map and not draining (a draining node is on its
	// way out), or among all live members when no map exists.
	first := false
	for _, m := range want {
		inMap := latest.Epoch == 0 || slices.ContainsFunc(latest.Members, func(x store.MapMember) bool { return x.ID == m.ID })
		if inMap && !m.Draining && m.Weight > 0 {
			first = m.ID == o.id
			break
		}
	}
	if !(first && waited >= o.term/3) && waited < 2*o.term {
		return
	}
	next := store.ClusterMap{Epoch: latest.Epoch + 1, Members: want}
	err := o.st.ProposeClusterMap(ctx, next)
	switch {
	case err == nil:
		o.m.proposals.WithLabelValues("ok").Inc()
		o.log.Info("cluster: epoch proposed", "epoch", next.Epoch, "members", len(want))
		o.install(next)
	case errors.Is(err, store.ErrExists):
		o.m.proposals.WithLabelValues("lost").Inc()
	default:
		o.m.proposals.WithLabelValues("error").Inc()
		o.log.Warn("cluster: proposing an epoch", "epoch", next.Epoch, "err", err)
	}
}

// liveLocked returns the members the next map should list, sorted by ID:
//   - the members of view (this node always) whose lease row is present
//     and was renewed within two terms (goneLocked): a node cut off from
//     the store manages nothing, whether or not gossip still reaches it,
//     and a node whose renewals are merely slow (a pause, a slow store)
//     keeps its place rather than having its buckets moved away and back;
//   - the members of latest that view misses but whose lease row was
//     renewed within two renewal periods (renewingLocked), with the
//     weight and draining the map gives them: a node the store still
//     hears from is alive, whatever this node's gossip says.
//
// Both parts but the view's metadata come from the lease rows, which all
// nodes read alike, so their wants agree once gossip spreads the
// metadata (between two renewal periods and two terms without a renewal,
// a node only some views list is wanted by those alone, for at most that
// long). A node killed drops out of the second part within two
// renewal periods, before memberlist declares it dead; a node cut off
// from most of its peers but not from the store stops renewing
// (isolatedLocked) and so drops out too.
func (o *Owner) liveLocked(view membership.View, latest store.ClusterMap) []store.MapMember {
	want := make([]store.MapMember, 0, len(view.Members))
	inView := make(map[string]bool, len(view.Members))
	for _, m := range view.Members {
		inView[m.ID] = true
		if p := o.peers[m.ID]; m.ID != o.id && (p == nil || o.goneLocked(p)) {
			continue
		}
		want = append(want, store.MapMember{ID: m.ID, Weight: m.Meta.Weight, Draining: m.Meta.Draining})
	}
	for _, m := range latest.Members {
		if p := o.peers[m.ID]; !inView[m.ID] && p != nil && o.renewingLocked(p) {
			want = append(want, m)
		}
	}
	slices.SortFunc(want, func(a, b store.MapMember) int { return cmpString(a.ID, b.ID) })
	return want
}

// goneLocked reports whether p's node gave its lease up or has not renewed
// it for two terms.
func (o *Owner) goneLocked(p *peer) bool {
	return p.lease.Released || p.lastRead.Sub(p.seen) >= 2*o.term
}

// renewingLocked reports whether p's lease row changed within two renewal
// periods (2·term/3) of the latest read: its node writes to the store.
func (o *Owner) renewingLocked(p *peer) bool {
	return !p.lease.Released && p.lastRead.Sub(p.seen) < 2*o.term/3
}

// stopLoops stops the renewal and the main loop, leaving the state as it
// is: the node answers as before until its lease runs out.
func (o *Owner) stopLoops() {
	select {
	case <-o.stop:
	default:
		close(o.stop)
	}
	o.wg.Wait()
}

func cmpString(a, b string) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// Close stops the protocol and gives the lease up: this node stops
// managing every bucket, waits until ctx ends for its writes in flight,
// and writes its lease row Released, so that the others take its buckets
// without waiting for the lease to expire. If the writes in flight do not
// finish in time, the lease is left to expire instead.
func (o *Owner) Close(ctx context.Context) error {
	return o.shutdown(ctx, true)
}

// shutdown stops the loops; with release it gives the lease up as Close
// says, without it the lease is left to expire (as when the process dies).
func (o *Owner) shutdown(ctx context.Context, release bool) error {
	var err error
	o.once.Do(func() {
		o.stopLoops()
		o.mu.Lock()
		o.dropAllLocked()
		o.closed = true
		o.cond.Broadcast()
		o.mu.Unlock()
		if !release {
			return
		}
		done := make(chan struct{})
		abandon := false // guarded by mu
		go func() {
			o.mu.Lock()
			for !abandon && slices.ContainsFunc(o.inflight[:], func(n int32) bool { return n > 0 }) {
				o.cond.Wait()
			}
			o.mu.Unlock()
			close(done)
		}()
		select {
		case <-done:
		case <-ctx.Done():
			o.mu.Lock()
			abandon = true
			o.cond.Broadcast()
			o.mu.Unlock()
			<-done
			err = fmt.Errorf("ownership: writes in flight at close: the lease is left to expire: %w", ctx.Err())
			return
		}
		o.leaseMu.Lock()
		defer o.leaseMu.Unlock()
		o.mu.Lock()
		o.renewal++
		l := store.NodeLease{Node: o.id, Adopted: o.adopted, Renewal: o.renewal, Released: true}
		o.mu.Unlock()
		if _, perr := o.putLease(l); perr != nil {
			err = fmt.Errorf("ownership: releasing the lease: %w", perr)
		}
	})
	return err
}
