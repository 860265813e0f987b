// Package membership is the cluster's membership: which nodes exist, which
// are alive, and what each says of itself (Meta), agreed by gossip with
// github.com/hashicorp/memberlist (SWIM with Lifeguard) over the cluster
// transport (gossip.go; docs/adr/0020).
//
// A node's identity is a random ID kept in its data directory (LoadID),
// which is also its memberlist name and the ID in its certificate. The
// states a node can be in, as this node sees them:
//
//   - alive: answering probes;
//   - suspect: a probe failed and the suspicion has not yet timed out or
//     been refuted; still a member of the live set;
//   - dead: declared dead after the suspicion timed out, or left (stopped
//     gracefully); not in the live set. Dead nodes stay listed for
//     Options.DeadRetention, so that an operator sees them;
//   - draining: alive, and giving its buckets up (Meta.Draining).
//
// The live set (View) is every node that is alive, suspect or draining.
// Subscribe delivers it at every change; the user map is computed from it
// (internal/cluster).
package membership

import (
	"context"
	"errors"
	"fmt"
	"log"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/hashicorp/memberlist"
	"github.com/prometheus/client_golang/prometheus"

	"quill/internal/cluster/transport"
)

// State is a node's membership state.
type State string

const (
	Alive    State = "alive"
	Suspect  State = "suspect"
	Dead     State = "dead"
	Draining State = "draining"
)

// Defaults of Options.
const (
	// DefaultDetectionTimeout: the bound on noticing a dead node.
	DefaultDetectionTimeout = 2 * time.Second
	// DefaultDeadRetention: how long a dead node stays listed.
	DefaultDeadRetention = time.Hour
	// DefaultWeight is a node's weight in service; a node under sustained
	// overload lowers its own (internal/cluster, balance.go).
	DefaultWeight = 100
)

// Member is one node as this node sees it.
type Member struct {
	ID    string
	Meta  Meta
	State State
	// Since is when this node last saw the member's state change between
	// live and dead (its join or its death), in this node's clock.
	Since time.Time
}

// Live reports whether m is in the live set.
func (m Member) Live() bool { return m.State != Dead }

// View is the live set at one moment: every member alive, suspect or
// draining, sorted by ID.
type View struct {
	// Seq numbers the views this node has seen; it is local, not agreed
	// between nodes.
	Seq     uint64
	Members []Member
}

// Options configure Start.
type Options struct {
	// ID is this node's ID (LoadID); it must be the ID in Transport's
	// certificate.
	ID        string
	Transport *transport.Transport
	// GossipKey encrypts and authenticates memberlist's messages
	// (credentials.Node.GossipKey): 16, 24 or 32 bytes.
	GossipKey []byte
	// Join lists host:port of nodes to join; empty starts a new cluster.
	// Unreachable at start, they are tried again in the background until
	// another node is seen.
	Join []string
	// DetectionTimeout is the bound on declaring a dead node dead
	// (docs/adr/0020 derives memberlist's timers from it).
	DetectionTimeout time.Duration
	// Weight is this node's Meta.Weight (default DefaultWeight).
	Weight        uint32
	DeadRetention time.Duration
	Logger        *slog.Logger
	Registerer    prometheus.Registerer // may be nil
}

// Membership is this node's membership in the cluster. Its methods are
// safe for concurrent use.
type Membership struct {
	opts Options
	log  *slog.Logger
	ml   *memberlist.Memberlist
	conf *memberlist.Config // as memberlist completed it (its Keyring)
	gt   *gossipTransport

	mu struct {
		sync.Mutex
		meta    Meta              // this node's
		members map[string]*entry // every node seen, by ID
		seq     uint64            // of the last view published
		subs    map[int]chan View // capacity 1: the latest view
		nextSub int
		closed  bool
	}
	changes prometheus.Counter

	stop chan struct{}
	wg   sync.WaitGroup
	once sync.Once
}

type entry struct {
	meta  Meta
	live  bool
	since time.Time
}

// Start creates this node's memberlist on the transport, joins the nodes
// in Options.Join (or starts a cluster), and returns.
func Start(ctx context.Context, opts Options) (*Membership, error) {
	if opts.Transport == nil || opts.ID == "" {
		return nil, errors.New("membership: no transport or ID")
	}
	if opts.Transport.ID() != opts.ID {
		return nil, fmt.Errorf("membership: ID %s is not the transport's %s", opts.ID, opts.Transport.ID())
	}
	if opts.DetectionTimeout <= 0 {
		opts.DetectionTimeout = DefaultDetectionTimeout
	}
	if opts.Weight == 0 {
		opts.Weight = DefaultWeight
	}
	if opts.DeadRetention <= 0 {
		opts.DeadRetention = DefaultDeadRetention
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	m := &Membership{opts: opts, log: opts.Logger, stop: make(chan struct{})}
	m.mu.meta = Meta{Addr: opts.Transport.Addr().String(), Weight: opts.Weight}
	m.mu.members = map[string]*entry{}
	m.mu.subs = map[int]chan View{}
	m.changes = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "quill_cluster_membership_changes_total",
		Help: "Changes of the live set this node has seen (joins, deaths, metadata changes).",
	})
	conf := Config(opts.DetectionTimeout)
	conf.Name = opts.ID
	m.gt = newGossipTransport(opts.Transport)
	conf.Transport = m.gt
	conf.SecretKey = opts.GossipKey
	conf.Delegate = delegate{m}
	conf.Events = events{m}
	conf.Logger = log.New(logWriter{opts.Logger.With("component", "memberlist")}, "", 0)
	ml, err := memberlist.Create(conf)
	if err != nil {
		m.gt.Shutdown()
		return nil, fmt.Errorf("membership: %w", err)
	}
	m.ml = ml
	m.conf = conf
	if opts.Registerer != nil {
		for _, c := range []prometheus.Collector{m.changes, memberCollector{m}} {
			if err := opts.Registerer.Register(c); err != nil {
				m.Close()
				return nil, fmt.Errorf("membership: metrics: %w", err)
			}
		}
	}

	self := opts.Transport.Addr().String()
	join := slices.DeleteFunc(slices.Clone(opts.Join), func(a string) bool { return a == self })
	if len(join) > 0 {
		if n, err := ml.Join(join); err != nil || n == 0 {
			m.log.Warn("cluster: no node to join answered; retrying in the background", "join", join, "err", err)
		} else {
			m.log.Info("cluster: joined", "contacted", n, "members", ml.NumMembers())
		}
	}
	m.wg.Add(1)
	go m.reconnectLoop(join)
	return m, nil
}

// Config returns the memberlist configuration that declares a dead node
// dead within detection (docs/adr/0020): probes every detection/10, a
// direct probe answered within half of that, a suspicion of three probe
// intervals (scaled by log10 of the cluster's size past 10 nodes) that
// confirmations do not lengthen. The caller sets the name, transport, key
// and delegates.
func Config(detection time.Duration) *memberlist.Config {
	c := memberlist.DefaultLANConfig()
	c.ProbeInterval = detection / 10
	c.ProbeTimeout = c.ProbeInterval / 2
	c.SuspicionMult = 3
	c.SuspicionMaxTimeoutMult = 1
	c.GossipInterval = c.ProbeInterval / 2
	c.PushPullInterval = 15 * time.Second
	c.TCPTimeout = max(detection, 5*time.Second)
	// A node restarted on another address may take its ID back once it
	// has been dead this long.
	c.DeadNodeReclaimTime = detection
	c.EnableCompression = false
	return c
}

// reconnectLoop, every detection timeout, joins the seeds while no other
// node is live, and otherwise one member listed dead, in turn. memberlist
// neither probes nor pushes state to the nodes it lists dead, so after a
// partition both sides would keep each other dead for good; a join
// exchanges the full state, in which each side finds itself listed dead
// and refutes it, and the next join (or gossip) carries the refutation.
// A member that is really gone costs a failed dial per round.
func (m *Membership) reconnectLoop(seeds []string) {
	defer m.wg.Done()
	tick := time.NewTicker(max(m.opts.DetectionTimeout, time.Second))
	defer tick.Stop()
	next := 0
	for {
		select {
		case <-m.stop:
			return
		case <-tick.C:
		}
		if m.ml.NumMembers() < 2 && len(seeds) > 0 {
			if n, err := m.ml.Join(seeds); err == nil && n > 0 {
				m.log.Info("cluster: joined", "contacted", n, "members", m.ml.NumMembers())
			}
			continue
		}
		dead := m.dead()
		if len(dead) == 0 {
			continue
		}
		d := dead[next%len(dead)]
		next++
		// name/address: the dial checks that the node answering is it.
		if _, err := m.ml.Join([]string{d.ID + "/" + d.Meta.Addr}); err == nil {
			m.log.Info("cluster: reached a node listed dead; exchanging state", "node", d.ID, "addr", d.Meta.Addr)
		}
	}
}

// dead returns the members listed dead, sorted by ID.
func (m *Membership) dead() []Member {
	return slices.DeleteFunc(m.Members(), func(mb Member) bool { return mb.State != Dead || mb.Meta.Addr == "" })
}

// ID returns this node's ID.
func (m *Membership) ID() string { return m.opts.ID }

// Members returns every node this node knows of, dead ones included (for
// DeadRetention), with its current state, sorted by ID.
func (m *Membership) Members() []Member {
	suspect := map[string]bool{}
	for _, n := range m.ml.Members() {
		if n.State == memberlist.StateSuspect {
			suspect[n.Name] = true
		}
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.pruneLocked(time.Now())
	out := make([]Member, 0, len(m.mu.members))
	for id, e := range m.mu.members {
		mb := Member{ID: id, Meta: e.meta, Since: e.since, State: Dead}
		switch {
		case !e.live:
		case e.meta.Draining:
			mb.State = Draining
		case suspect[id]:
			mb.State = Suspect
		default:
			mb.State = Alive
		}
		out = append(out, mb)
	}
	slices.SortFunc(out, func(a, b Member) int { return cmpString(a.ID, b.ID) })
	return out
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

// Live returns the current live set.
func (m *Membership) Live() View {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.viewLocked()
}

func (m *Membership) viewLocked() View {
	v := View{Seq: m.mu.seq}
	for id, e := range m.mu.members {
		if e.live {
			st := Alive
			if e.meta.Draining {
				st = Draining
			}
			v.Members = append(v.Members, Member{ID: id, Meta: e.meta, State: st, Since: e.since})
		}
	}
	slices.SortFunc(v.Members, func(a, b Member) int { return cmpString(a.ID, b.ID) })
	return v
}

// Subscribe returns a channel that holds the latest live set whenever it
// changes (a join, a death, a node's metadata), starting with the current
// one. A slow reader misses intermediate views, never the latest. cancel
// ends the subscription and closes the channel; Close closes every one.
func (m *Membership) Subscribe() (views <-chan View, cancel func()) {
	ch := make(chan View, 1)
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.mu.closed {
		close(ch)
		return ch, func() {}
	}
	id := m.mu.nextSub
	m.mu.nextSub++
	m.mu.subs[id] = ch
	ch <- m.viewLocked()
	return ch, func() {
		m.mu.Lock()
		defer m.mu.Unlock()
		if _, ok := m.mu.subs[id]; ok {
			delete(m.mu.subs, id)
			close(ch)
		}
	}
}

// changedLocked records a change of the live set and publishes it.
func (m *Membership) changedLocked() {
	m.mu.seq++
	m.changes.Inc()
	v := m.viewLocked()
	for _, ch := range m.mu.subs {
		select { // replace an unread view: only the latest matters
		case <-ch:
		default:
		}
		ch <- v // never blocks: the channel is empty and only we send
	}
}

// pruneLocked forgets nodes dead for longer than DeadRetention.
func (m *Membership) pruneLocked(now time.Time) {
	for id, e := range m.mu.members {
		if !e.live && now.Sub(e.since) > m.opts.DeadRetention {
			delete(m.mu.members, id)
		}
	}
}

// SetDraining marks this node draining (or no longer) and tells the
// cluster; it returns once the change is sent to the other nodes, or
// ctx ends (the change then still spreads by gossip).
func (m *Membership) SetDraining(ctx context.Context, draining bool) error {
	return m.updateMeta(ctx, fmt.Sprintf("draining=%v", draining), func(mt *Meta) bool {
		changed := mt.Draining != draining
		mt.Draining = draining
		return changed
	})
}

// SetWeight sets this node's Meta.Weight and tells the cluster, as
// SetDraining does: the next map epoch gives the node a share of buckets
// in proportion.
func (m *Membership) SetWeight(ctx context.Context, w uint32) error {
	return m.updateMeta(ctx, fmt.Sprintf("weight %d", w), func(mt *Meta) bool {
		changed := mt.Weight != w
		mt.Weight = w
		return changed
	})
}

// updateMeta applies change to this node's metadata and, if it changed
// anything, sends the new metadata to the other nodes (within ctx).
func (m *Membership) updateMeta(ctx context.Context, what string, change func(*Meta) bool) error {
	m.mu.Lock()
	changed := change(&m.mu.meta)
	m.mu.Unlock()
	if !changed {
		return nil
	}
	timeout := 5 * time.Second
	if d, ok := ctx.Deadline(); ok {
		timeout = time.Until(d)
	}
	if err := m.ml.UpdateNode(timeout); err != nil {
		return fmt.Errorf("membership: announcing %s: %w", what, err)
	}
	return nil
}

// Weight returns this node's current Meta.Weight.
func (m *Membership) Weight() uint32 {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.mu.meta.Weight
}

// Leave tells the other nodes that this node is going (they list it dead
// at once instead of detecting it) and waits until that is sent or ctx
// ends. Close must still be called.
func (m *Membership) Leave(ctx context.Context) error {
	select {
	case <-m.stop:
		return errors.New("membership: leave after close") // memberlist panics on it
	default:
	}
	timeout := 5 * time.Second
	if d, ok := ctx.Deadline(); ok {
		timeout = time.Until(d)
	}
	if err := m.ml.Leave(timeout); err != nil {
		return fmt.Errorf("membership: leaving: %w", err)
	}
	return nil
}

// Close stops this node's gossip at once: without Leave, the others
// detect it dead, as if its process had died. It closes every
// subscription. It does not close the transport.
func (m *Membership) Close() error {
	var err error
	m.once.Do(func() {
		close(m.stop)
		err = m.ml.Shutdown()
		m.wg.Wait()
		m.mu.Lock()
		m.mu.closed = true
		for id, ch := range m.mu.subs {
			delete(m.mu.subs, id)
			close(ch)
		}
		m.mu.Unlock()
	})
	return err
}

// delegate gives memberlist this node's metadata; Quill sends no user
// messages over gossip.
type delegate struct{ m *Membership }

func (d delegate) NodeMeta(limit int) []byte {
	d.m.mu.Lock()
	meta := d.m.mu.meta
	d.m.mu.Unlock()
	b, err := encodeMeta(meta)
	if err != nil || len(b) > limit {
		d.m.log.Error("cluster: node metadata too large", "bytes", len(b), "limit", limit, "err", err)
		return nil
	}
	return b
}

func (delegate) NotifyMsg([]byte)                           {}
func (delegate) GetBroadcasts(overhead, limit int) [][]byte { return nil }
func (delegate) LocalState(join bool) []byte                { return nil }
func (delegate) MergeRemoteState(buf []byte, join bool)     {}

// events keeps the member table from memberlist's notifications. They
// are made with memberlist's locks held: they must not call memberlist.
type events struct{ m *Membership }

func (e events) NotifyJoin(n *memberlist.Node) { e.m.seen(n, true) }
func (e events) NotifyLeave(n *memberlist.Node) {
	e.m.seen(n, false)
	if n.Name != e.m.opts.ID {
		e.m.opts.Transport.Forget(n.Name)
	}
}
func (e events) NotifyUpdate(n *memberlist.Node) { e.m.seen(n, true) }

// seen records what memberlist says of node n: live, with its metadata,
// or dead.
func (m *Membership) seen(n *memberlist.Node, live bool) {
	meta, err := decodeMeta(n.Meta)
	if err != nil {
		// A node whose metadata does not decode (another version, or
		// none yet) is still listed, at its gossip address, with no
		// weight: it gets no buckets.
		meta = Meta{Addr: n.Address()}
		if live {
			m.log.Warn("cluster: node metadata unreadable; the node gets no buckets", "node", n.Name, "err", err)
		}
	}
	now := time.Now()
	m.mu.Lock()
	defer m.mu.Unlock()
	e, ok := m.mu.members[n.Name]
	if !ok {
		e = &entry{}
		m.mu.members[n.Name] = e
	}
	if ok && e.live == live && e.meta == meta {
		return
	}
	if !ok || e.live != live {
		e.since = now
		if live {
			m.log.Info("cluster: node alive", "node", n.Name, "addr", meta.Addr)
		} else {
			m.log.Warn("cluster: node dead or left", "node", n.Name, "addr", meta.Addr)
		}
	}
	e.live, e.meta = live, meta
	m.pruneLocked(now)
	m.changedLocked()
}

// memberCollector reports the members by state at each scrape.
type memberCollector struct{ m *Membership }

var membersDesc = prometheus.NewDesc("quill_cluster_members", "Nodes this node knows of, by membership state.", []string{"state"}, nil)

func (c memberCollector) Describe(ch chan<- *prometheus.Desc) { ch <- membersDesc }

func (c memberCollector) Collect(ch chan<- prometheus.Metric) {
	counts := map[State]int{Alive: 0, Suspect: 0, Dead: 0, Draining: 0}
	for _, mb := range c.m.Members() {
		counts[mb.State]++
	}
	for st, n := range counts {
		ch <- prometheus.MustNewConstMetric(membersDesc, prometheus.GaugeValue, float64(n), string(st))
	}
}
