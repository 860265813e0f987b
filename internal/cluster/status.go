package cluster

import (
	"context"
	"fmt"
	"sync"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"quill/internal/cluster/clusterpb"
	"quill/internal/cluster/membership"
	"quill/internal/cluster/ownership"
	"quill/internal/cluster/transport"
	"quill/internal/cluster/usermap"
)

// NodeStatus is one node as this node reports it.
type NodeStatus struct {
	ID    string
	Addr  string
	State membership.State
	// Buckets is the number of buckets the user map assigns the node over
	// the current live set (0 for a dead or draining node).
	Buckets int
	// Load as the node itself reported it (a Status RPC); nil when it is
	// dead or did not answer (Error says why).
	Load  *Load
	Self  bool
	Error string
	// Adopted is the map epoch the node has adopted, as its lease row
	// says; Lease its lease as this node sees it (ownership.Lease*).
	Adopted uint64
	Lease   string
	// Managed is the number of buckets this node manages now (this node
	// only: others report theirs in their own status).
	Managed int
}

// Status is the cluster as this node sees it.
type Status struct {
	Self string
	// Buckets is the number of buckets in the cluster (usermap.Buckets);
	// the nodes' Buckets sum to it while a live node is not draining.
	Buckets int
	// Epoch is the newest map epoch this node has read.
	Epoch uint64
	Nodes []NodeStatus
}

// Status lists every node this node knows of, with its state, its share
// of the user map, and the load it reports (asked of each live node in
// parallel, each call bounded by rpcTimeout).
func (n *Node) Status(ctx context.Context) Status {
	mem := n.mem.Load()
	members := mem.Members()
	counts := bucketCounts(mem.Live())
	own := n.own.Load().Status()
	leases := map[string]ownership.NodeStatus{}
	for _, ns := range own.Nodes {
		leases[ns.ID] = ns
	}
	st := Status{Self: n.ID(), Buckets: usermap.Buckets, Epoch: own.Epoch, Nodes: make([]NodeStatus, len(members))}
	var wg sync.WaitGroup
	for i, m := range members {
		ns := NodeStatus{ID: m.ID, Addr: m.Meta.Addr, State: m.State, Buckets: counts[m.ID], Self: m.ID == n.ID(),
			Adopted: leases[m.ID].Adopted, Lease: leases[m.ID].Lease}
		if ns.Lease == "" {
			ns.Lease = ownership.LeaseNone
		}
		if ns.Self {
			ns.Managed = own.Managed
		}
		st.Nodes[i] = ns
		switch {
		case ns.Self:
			ld := n.currentLoad()
			st.Nodes[i].Load = &ld
		case m.State == membership.Dead:
		default:
			wg.Add(1)
			go func() {
				defer wg.Done()
				ld, err := n.remoteStatus(ctx, m)
				if err != nil {
					st.Nodes[i].Error = err.Error()
					return
				}
				st.Nodes[i].Load = &ld
			}()
		}
	}
	wg.Wait()
	return st
}

// bucketCounts returns how many buckets the user map assigns each node of
// the live set. Every node weighs membership.DefaultWeight today; the map
// leaves draining nodes out.
func bucketCounts(v membership.View) map[string]int {
	ms := make([]usermap.Member, 0, len(v.Members))
	for _, m := range v.Members {
		ms = append(ms, usermap.Member{ID: usermap.NodeID(m.ID), Weight: m.Meta.Weight, Draining: m.Meta.Draining})
	}
	out := map[string]int{}
	um, err := usermap.New(v.Seq, ms)
	if err != nil {
		return out // no eligible member: no node has buckets
	}
	for _, id := range um.Nodes() {
		out[string(id)] = len(um.Buckets(id))
	}
	return out
}

func (n *Node) remoteStatus(ctx context.Context, m membership.Member) (Load, error) {
	cc, err := n.tr.Client(m.ID, m.Meta.Addr)
	if err != nil {
		return Load{}, err
	}
	ctx, cancel := context.WithTimeout(ctx, rpcTimeout)
	defer cancel()
	r, err := clusterpb.NewNodeClient(cc).Status(ctx, &clusterpb.StatusRequest{})
	if err != nil {
		return Load{}, fmt.Errorf("status of %s: %w", m.ID, err)
	}
	if r.NodeId != m.ID {
		return Load{}, fmt.Errorf("status of %s: answered by %s", m.ID, r.NodeId)
	}
	return loadFrom(r.Load), nil
}

// Drain marks node id draining (or, with draining false, back in
// service): this node itself, or another live node through its Drain RPC.
// It returns the node's state afterwards.
func (n *Node) Drain(ctx context.Context, id string, draining bool) (membership.State, error) {
	if id == n.ID() {
		if err := n.mem.Load().SetDraining(ctx, draining); err != nil {
			return "", err
		}
		return selfState(draining), nil
	}
	for _, m := range n.mem.Load().Members() {
		if m.ID != id || m.State == membership.Dead {
			continue
		}
		cc, err := n.tr.Client(m.ID, m.Meta.Addr)
		if err != nil {
			return "", err
		}
		ctx, cancel := context.WithTimeout(ctx, rpcTimeout)
		defer cancel()
		r, err := clusterpb.NewNodeClient(cc).Drain(ctx, &clusterpb.DrainRequest{Draining: draining})
		if err != nil {
			return "", fmt.Errorf("drain %s: %w", id, err)
		}
		return membership.State(r.State), nil
	}
	return "", fmt.Errorf("%w: %s", ErrUnknownNode, id)
}

func selfState(draining bool) membership.State {
	if draining {
		return membership.Draining
	}
	return membership.Alive
}

func loadFrom(l *clusterpb.Load) Load {
	if l == nil {
		return Load{}
	}
	return Load{Sessions: int(l.Sessions), CPU: l.Cpu, Overloaded: l.Overloaded}
}

func loadTo(l Load) *clusterpb.Load {
	return &clusterpb.Load{Sessions: uint32(max(l.Sessions, 0)), Cpu: l.CPU, Overloaded: l.Overloaded}
}

// currentLoad is this node's load now, as reported to the others.
func (n *Node) currentLoad() Load {
	ld := n.load.Current()
	return Load{Sessions: ld.Sessions, CPU: ld.CPU, Overloaded: ld.Overloaded}
}

// service is the Node RPC service this node serves to the others.
type service struct {
	clusterpb.UnimplementedNodeServer
	n *Node
}

var errStarting = status.Error(codes.Unavailable, "cluster: node starting")

func (s *service) Status(ctx context.Context, _ *clusterpb.StatusRequest) (*clusterpb.StatusReply, error) {
	mem := s.n.mem.Load()
	if mem == nil {
		return nil, errStarting
	}
	draining := false
	for _, m := range mem.Live().Members {
		if m.ID == s.n.ID() {
			draining = m.Meta.Draining
		}
	}
	return &clusterpb.StatusReply{NodeId: s.n.ID(), Addr: s.n.Addr(), State: string(selfState(draining)), Load: loadTo(s.n.currentLoad())}, nil
}

func (s *service) Drain(ctx context.Context, req *clusterpb.DrainRequest) (*clusterpb.DrainReply, error) {
	mem := s.n.mem.Load()
	if mem == nil {
		return nil, errStarting
	}
	if err := mem.SetDraining(ctx, req.Draining); err != nil {
		return nil, status.Error(codes.Unavailable, err.Error())
	}
	caller, _ := transport.PeerNode(ctx)
	s.n.log.Info("cluster: draining set by another node", "draining", req.Draining, "by", caller)
	return &clusterpb.DrainReply{State: string(selfState(req.Draining)), Load: loadTo(s.n.currentLoad())}, nil
}
