package ownership

import (
	"slices"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"quill/internal/cluster/usermap"
)

// Lease states of a node, as this node sees them (NodeStatus.Lease).
const (
	LeaseHeld     = "held"     // renewed within the term
	LeaseExpired  = "expired"  // not renewed for term + margin, or lapsed (this node)
	LeaseReleased = "released" // given up at a graceful stop
	LeaseUnseen   = "unseen"   // changed within the term, not yet known expired
	LeaseNone     = "none"     // no row in the store
)

// Status is the protocol's state as this node sees it.
type Status struct {
	// Epoch is the newest map epoch this node has read; Adopted the one it
	// has adopted.
	Epoch, Adopted uint64
	// Managed is how many buckets this node manages now; Pending how many
	// it owns at Adopted and awaits the handoff of.
	Managed, Pending int
	// Isolated: this node reaches only a minority of the nodes the store
	// hears from, and lets its lease expire (Owner.isolatedLocked).
	Isolated bool
	// Nodes are the nodes of the newest map and those with a lease row.
	Nodes []NodeStatus
}

// NodeStatus is one node in Status.
type NodeStatus struct {
	ID string
	// Adopted is the epoch in the node's lease row (this node's own for
	// itself).
	Adopted uint64
	// Lease is one of the Lease constants.
	Lease string
	// Buckets is how many buckets the newest map assigns the node.
	Buckets int
}

// Status returns the protocol's state.
func (o *Owner) Status() Status {
	now := time.Now()
	o.mu.Lock()
	defer o.mu.Unlock()
	st := Status{Epoch: o.latest.Epoch, Adopted: o.adopted, Isolated: o.isolated}
	for b := range uint32(usermap.Buckets) {
		if _, err := o.epochLocked(b, now); err == nil {
			st.Managed++
		}
		if o.pending[b] {
			st.Pending++
		}
	}
	byID := map[string]*NodeStatus{}
	node := func(id string) *NodeStatus {
		if n := byID[id]; n != nil {
			return n
		}
		n := &NodeStatus{ID: id, Lease: LeaseNone}
		byID[id] = n
		return n
	}
	for _, m := range o.latest.Members {
		n := node(m.ID)
		if o.latestMap != nil {
			n.Buckets = len(o.latestMap.Buckets(usermap.NodeID(m.ID)))
		}
	}
	self := node(o.id)
	self.Adopted, self.Lease = o.adopted, LeaseExpired
	if now.Before(o.heldUntil) {
		self.Lease = LeaseHeld
	}
	for id, p := range o.peers {
		n := node(id)
		n.Adopted = p.lease.Adopted
		switch {
		case p.lease.Released:
			n.Lease = LeaseReleased
		case o.expiredLocked(p):
			n.Lease = LeaseExpired
		case now.Sub(p.seen) < o.term:
			n.Lease = LeaseHeld
		default:
			n.Lease = LeaseUnseen
		}
	}
	for _, n := range byID {
		st.Nodes = append(st.Nodes, *n)
	}
	slices.SortFunc(st.Nodes, func(a, b NodeStatus) int { return cmpString(a.ID, b.ID) })
	return st
}

// metrics of the protocol.
type metrics struct {
	renewals  *prometheus.CounterVec
	moves     *prometheus.CounterVec
	proposals *prometheus.CounterVec
	adopted   prometheus.Gauge
	latest    prometheus.Gauge
	isolated  prometheus.Gauge
}

func newMetrics(reg prometheus.Registerer, o *Owner) (*metrics, error) {
	m := &metrics{
		renewals: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "quill_cluster_lease_renewals_total",
			Help: "Writes of this node's lease row, by result (ok, error; isolated: skipped, see quill_cluster_isolated).",
		}, []string{"result"}),
		moves: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "quill_cluster_bucket_moves_total",
			Help: "Buckets this node started (gained) or stopped (lost) managing.",
		}, []string{"direction"}),
		proposals: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "quill_cluster_epoch_proposals_total",
			Help: "Map epochs this node proposed, by result (ok, lost to another proposer, error).",
		}, []string{"result"}),
		adopted: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "quill_cluster_epoch_adopted",
			Help: "The map epoch this node has adopted.",
		}),
		latest: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "quill_cluster_epoch_latest",
			Help: "The newest map epoch this node has read.",
		}),
		isolated: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "quill_cluster_isolated",
			Help: "1 while this node reaches only a minority of the nodes the store hears from and lets its lease expire.",
		}),
	}
	if reg == nil {
		return m, nil
	}
	managed := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "quill_cluster_buckets_managed",
		Help: "Buckets this node manages now.",
	}, func() float64 { return float64(o.Status().Managed) })
	for _, c := range []prometheus.Collector{m.renewals, m.moves, m.proposals, m.adopted, m.latest, m.isolated, managed} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}
