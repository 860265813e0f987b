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
// What does not exist yet: pending deliveries, cross-node change events.
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
	"quill/internal/cluster/membership"
	"quill/internal/cluster/ownership"
	"quill/internal/cluster/transport"
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
	// Sessions returns the client connections open on this node's
	// protocol listeners, for its load.
	Sessions   func() int
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
	load  *loadSampler

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
	n = &Node{log: opts.Logger, creds: creds, load: startLoadSampler(opts.Sessions)}
	defer func() {
		if err != nil {
			n.load.stop()
		}
	}()
	n.tr, err = transport.Listen(transport.Options{
		Addr: opts.Addr, Advertise: opts.Advertise, Node: creds,
		Register:   func(r grpc.ServiceRegistrar) { clusterpb.RegisterNodeServer(r, &service{n: n}) },
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
		relCtx, cancel := context.WithTimeout(ctx, 5*time.Second)
		err := n.own.Load().Close(relCtx)
		cancel()
		mem := n.mem.Load()
		leaveCtx, cancel := context.WithTimeout(ctx, 2*time.Second)
		err = errors.Join(err, mem.Leave(leaveCtx))
		cancel()
		err = errors.Join(err, mem.Close())
		err = errors.Join(err, n.tr.Shutdown(ctx))
		n.load.stop()
		n.shutdownErr = err
	})
	return n.shutdownErr
}
