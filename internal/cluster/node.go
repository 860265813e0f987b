// Package cluster runs this node's part of the cluster: it starts, in
// order, the cluster's credentials (read from the store), the node-to-node
// transport, membership and the ownership protocol
// (internal/cluster/ownership: which buckets this node manages, under
// leases in the store), serves the Node RPC service on the transport
// (status, drain, and the forwarded mailbox writes, which it hands to the
// handler ServeForwarded installs), and answers what `quill cluster
// status` and `quill cluster drain` ask of it. Shutdown stops them in
// reverse.
//
// It also fans this node's change events out to the other live nodes
// (Events, internal/cluster/events) and hands theirs to the local hub.
//
// A node under sustained overload lowers its weight in the user map, and
// raises it again once recovered (balance.go). The pending deliveries'
// applier (internal/cluster/pending) runs beside it, started by the
// server with the user manager.
package cluster

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"

	"quill/internal/cluster/clusterpb"
	"quill/internal/cluster/credentials"
	"quill/internal/cluster/events"
	"quill/internal/cluster/membership"
	"quill/internal/cluster/ownership"
	"quill/internal/cluster/transport"
	"quill/internal/load"
	"quill/internal/store"
)

// ErrUnknownNode: no live node has the ID given. It wraps store.ErrNotFound.
var ErrUnknownNode = fmt.Errorf("cluster: no live node with that ID: %w", store.ErrNotFound)

// rpcTimeout bounds one call to another node on behalf of an operator: a
// live node on the cluster's network answers in milliseconds, and a status
// must not wait long on a node about to be declared dead.
const rpcTimeout = time.Second

// Options configure Start.
type Options struct {
	// DataDir holds the node's ID (membership.IDFile).
	DataDir string
	// Addr is the cluster listener (host:port, TCP and UDP); Advertise
	// the address other nodes reach it at ("" for Addr's).
	Addr, Advertise string
	// Join lists host:port of any live nodes; empty starts a cluster.
	Join             []string
	DetectionTimeout time.Duration
	// Secrets is the store holding the credentials (quill cluster init).
	Secrets credentials.Secrets
	// Ownership is the store holding the map epochs and node leases.
	Ownership store.Ownership
	// LeaseTerm is the lease term (ownership.DefaultTerm when zero).
	LeaseTerm time.Duration
	// Load is the node's load monitor, whose figures go with every reply
	// to the other nodes; nil reports none. The caller stops it.
	Load *load.Monitor
	// Local hears the change events of the other nodes (the hub of this
	// node's sessions).
	Local      events.Local
	Logger     *slog.Logger
	Registerer prometheus.Registerer // may be nil
}

// Node is this node's part of the cluster.
type Node struct {
	log   *slog.Logger
	creds *credentials.Node
	tr    *transport.Transport
	mem   atomic.Pointer[membership.Membership] // nil until membership started
	own   atomic.Pointer[ownership.Owner]       // nil until ownership started
	fwd   atomic.Pointer[Forwarded]             // nil until ServeForwarded
	load  *load.Monitor
	fan   *events.Fanout
	// peersDone is closed when the goroutine that keeps fan's peers in
	// step with membership has returned.
	peersDone chan struct{}
	// balanceStop ends the balancer (balance.go); balanceDone is closed
	// when it has returned (at once without a load monitor).
	balanceStop, balanceDone chan struct{}

	shutdown    sync.Once
	shutdownErr error
}

// Start loads the credentials, the node's ID, binds the transport and
// joins the cluster. On failure, whatever started is stopped again.
func Start(ctx context.Context, opts Options) (n *Node, err error) {
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	if opts.Ownership == nil {
		return nil, errors.New("cluster: no store for the ownership protocol")
	}
	rec, err := credentials.Load(ctx, opts.Secrets)
	if err != nil {
		return nil, err
	}
	id, created, err := membership.LoadID(opts.DataDir)
	if err != nil {
		return nil, err
	}
	creds, err := rec.ForNode(id, credentials.NodeOptions{})
	if err != nil {
		return nil, err
	}
	n = &Node{log: opts.Logger, creds: creds, load: opts.Load, peersDone: make(chan struct{}),
		balanceStop: make(chan struct{}), balanceDone: make(chan struct{})}
	local := opts.Local
	if local == nil {
		local = discard{}
	}
	n.fan = events.New(events.Options{
		Node: id, Local: local, Dial: func(peer, addr string) (*grpc.ClientConn, error) { return n.tr.Client(peer, addr) },
		Logger: opts.Logger, Registerer: opts.Registerer,
	})
	n.tr, err = transport.Listen(transport.Options{
		Addr: opts.Addr, Advertise: opts.Advertise, Node: creds,
		Register: func(r grpc.ServiceRegistrar) {
			clusterpb.RegisterNodeServer(r, &service{n: n})
			clusterpb.RegisterEventsServer(r, n.fan.Service())
		},
		Logger:     opts.Logger,
		Registerer: opts.Registerer,
	})
	if err != nil {
		return nil, err
	}
	mem, err := membership.Start(ctx, membership.Options{
		ID: id, Transport: n.tr, GossipKey: creds.GossipKey(), Join: opts.Join,
		DetectionTimeout: opts.DetectionTimeout, Logger: opts.Logger, Registerer: opts.Registerer,
	})
	if err != nil {
		n.tr.Close()
		return nil, err
	}
	n.mem.Store(mem)
	own, err := ownership.Start(ownership.Options{
		ID: id, Store: opts.Ownership, Subscribe: mem.Subscribe, Term: opts.LeaseTerm,
		Logger: opts.Logger, Registerer: opts.Registerer,
	})
	if err != nil {
		mem.Close()
		n.tr.Close()
		return nil, err
	}
	n.own.Store(own)
	views, cancel := mem.Subscribe()
	go n.followPeers(views, cancel)
	if n.load != nil {
		go n.balance(n.balanceStop)
	} else {
		close(n.balanceDone)
	}
	n.log.Info("cluster: node started", "node", id, "new_id", created, "addr", n.tr.Addr().String(),
		"ca", creds.Fingerprint(), "members", len(mem.Live().Members))
	return n, nil
}

// ID returns this node's ID.
func (n *Node) ID() string { return n.creds.ID() }

// Addr returns the address other nodes reach this one at.
func (n *Node) Addr() string { return n.tr.Addr().String() }

// Membership returns this node's membership.
func (n *Node) Membership() *membership.Membership { return n.mem.Load() }

// Owner returns this node's part of the ownership protocol: the user
// manager's usermgr.Owner, and the forwarder's guide to managers.
func (n *Node) Owner() *ownership.Owner { return n.own.Load() }

// Client returns the RPC connection to the live node id (for forwarded
// writes), or ErrUnknownNode.
func (n *Node) Client(id string) (clusterpb.NodeClient, error) {
	for _, m := range n.mem.Load().Members() {
		if m.ID == id && m.State != membership.Dead {
			cc, err := n.tr.Client(m.ID, m.Meta.Addr)
			if err != nil {
				return nil, err
			}
			return clusterpb.NewNodeClient(cc), nil
		}
	}
	return nil, fmt.Errorf("%w: %s", ErrUnknownNode, id)
}

// Shutdown gives this node's lease up once its writes in flight are done
// (the others then take its buckets at once), leaves the cluster (the
// others list this node dead at once), stops membership, then the
// transport, giving RPCs in progress until ctx ends. It is safe to call
// more than once.
func (n *Node) Shutdown(ctx context.Context) error {
	n.shutdown.Do(func() {
		close(n.balanceStop)
		<-n.balanceDone
		relCtx, cancel := context.WithTimeout(ctx, 5*time.Second)
		err := n.own.Load().Close(relCtx)
		cancel()
		mem := n.mem.Load()
		leaveCtx, cancel := context.WithTimeout(ctx, 2*time.Second)
		err = errors.Join(err, mem.Leave(leaveCtx))
		cancel()
		err = errors.Join(err, mem.Close())
		<-n.peersDone
		n.fan.Close()
		err = errors.Join(err, n.tr.Shutdown(ctx))
		n.shutdownErr = err
	})
	return n.shutdownErr
}

// Events returns the fan-out of this node's change events: the user
// manager's Notifier with the cluster on.
func (n *Node) Events() *events.Fanout { return n.fan }

// followPeers keeps the fan-out's peers the live members other than this
// node, until membership closes the subscription.
func (n *Node) followPeers(views <-chan membership.View, cancel func()) {
	defer close(n.peersDone)
	defer cancel()
	for v := range views {
		var peers []events.Peer
		for _, m := range v.Members {
			if m.ID != n.ID() {
				peers = append(peers, events.Peer{ID: m.ID, Addr: m.Meta.Addr})
			}
		}
		n.fan.SetPeers(peers)
	}
}

// discard is the Local of a node started without one.
type discard struct{}

func (discard) Notify(store.ID) {}
