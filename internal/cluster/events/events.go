// Package events fans a node's change events out to the other nodes of the
// cluster (docs/adr/0029): after its user manager makes a write durable, a
// node tells every other live node which mailboxes changed, and each wakes
// the sessions it has on them (IMAP IDLE, or a selected mailbox) through
// its local hub. An event carries no data, only "this mailbox's change log
// grew": the woken session reads the log itself, so an event lost or
// duplicated costs latency, never correctness, and polling stays as the
// safety net.
//
// Each peer has one sender goroutine with one call in flight; events that
// arrive meanwhile coalesce into the next call (a set of mailbox IDs), so
// the cost of a burst is one call per peer per round trip, not one per
// write. The set is bounded; past the bound events are dropped (counted).
package events

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"

	"quill/internal/cluster/clusterpb"
	"quill/internal/store"
)

// Defaults of Options.
const (
	// DefaultCallTimeout bounds one Changed call: a live peer on the
	// cluster's network answers in a millisecond or so.
	DefaultCallTimeout = 2 * time.Second
	// DefaultMaxPending bounds the mailbox IDs waiting for one peer.
	DefaultMaxPending = 1 << 16
)

// Local is where events for this node go: the hub of its sessions
// (mailbox.Hub). Notify must not block.
type Local interface {
	Notify(mailbox store.ID)
}

// Peer is another live node.
type Peer struct {
	ID, Addr string
}

// Options configure New.
type Options struct {
	Local Local
	// Dial returns the RPC connection to a peer (transport.Client).
	Dial        func(peer, addr string) (*grpc.ClientConn, error)
	CallTimeout time.Duration
	MaxPending  int
	Logger      *slog.Logger
	Registerer  prometheus.Registerer // may be nil
}

// Fanout publishes this node's change events locally and to its peers. It
// implements usermgr.Notifier. It is safe for concurrent use.
type Fanout struct {
	opts Options
	m    *metrics

	mu     sync.Mutex
	peers  map[string]*sender // by peer ID
	closed bool
	wg     sync.WaitGroup
}

// New returns a Fanout with no peers yet (SetPeers).
func New(opts Options) *Fanout {
	if opts.CallTimeout <= 0 {
		opts.CallTimeout = DefaultCallTimeout
	}
	if opts.MaxPending <= 0 {
		opts.MaxPending = DefaultMaxPending
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	return &Fanout{opts: opts, m: newMetrics(opts.Registerer), peers: map[string]*sender{}}
}

// Notify publishes that mailbox changed: to the local hub at once, and to
// every peer by its sender. It never blocks.
func (f *Fanout) Notify(mailbox store.ID) {
	f.opts.Local.Notify(mailbox)
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, s := range f.peers {
		s.add(mailbox)
	}
}

// SetPeers makes peers the nodes events go to: a sender starts for each new
// one and stops for each one gone (its pending events dropped).
func (f *Fanout) SetPeers(peers []Peer) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed {
		return
	}
	keep := make(map[string]bool, len(peers))
	for _, p := range peers {
		keep[p.ID] = true
		if s, ok := f.peers[p.ID]; ok && s.peer.Addr == p.Addr {
			continue
		} else if ok {
			s.stop()
		}
		s := &sender{f: f, peer: p, wake: make(chan struct{}, 1), quit: make(chan struct{}), pending: map[store.ID]struct{}{}}
		f.peers[p.ID] = s
		f.wg.Add(1)
		go s.run()
	}
	for id, s := range f.peers {
		if !keep[id] {
			s.stop()
			delete(f.peers, id)
		}
	}
}

// Close stops every sender and waits for them; events still pending are
// dropped.
func (f *Fanout) Close() {
	f.mu.Lock()
	f.closed = true
	for id, s := range f.peers {
		s.stop()
		delete(f.peers, id)
	}
	f.mu.Unlock()
	f.wg.Wait()
}

// sender is the goroutine that sends one peer its events.
type sender struct {
	f    *Fanout
	peer Peer
	wake chan struct{}
	quit chan struct{}
	once sync.Once

	mu      sync.Mutex
	pending map[store.ID]struct{}
}

func (s *sender) add(id store.ID) {
	s.mu.Lock()
	if len(s.pending) >= s.f.opts.MaxPending {
		s.mu.Unlock()
		s.f.m.dropped.Inc()
		return
	}
	s.pending[id] = struct{}{}
	s.mu.Unlock()
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

func (s *sender) stop() { s.once.Do(func() { close(s.quit) }) }

func (s *sender) run() {
	defer s.f.wg.Done()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		<-s.quit
		cancel()
	}()
	for {
		select {
		case <-s.quit:
			return
		case <-s.wake:
		}
		s.mu.Lock()
		ids := make([][]byte, 0, len(s.pending))
		for id := range s.pending {
			ids = append(ids, id[:])
		}
		clear(s.pending)
		s.mu.Unlock()
		if len(ids) == 0 {
			continue
		}
		s.send(ctx, ids)
	}
}

// send makes one Changed call; a failure drops its events (the peer's
// sessions still poll) and is logged at debug level, since a peer that
// just died fails until membership notices.
func (s *sender) send(ctx context.Context, ids [][]byte) {
	conn, err := s.f.opts.Dial(s.peer.ID, s.peer.Addr)
	if err == nil {
		cctx, cancel := context.WithTimeout(ctx, s.f.opts.CallTimeout)
		_, err = clusterpb.NewEventsClient(conn).Changed(cctx, &clusterpb.ChangedRequest{Mailboxes: ids})
		cancel()
	}
	if err != nil {
		s.f.m.dropped.Add(float64(len(ids)))
		s.f.opts.Logger.Debug("cluster: change events not delivered", "peer", s.peer.ID, "events", len(ids), "err", err)
		return
	}
	s.f.m.sent.Add(float64(len(ids)))
	s.f.m.calls.Inc()
}

// Service is the Events RPC service: it hands every mailbox a peer says
// changed to the local hub.
type Service struct {
	clusterpb.UnimplementedEventsServer
	local Local
	m     *metrics
}

// Service returns f's RPC service, to register on the node's gRPC server.
func (f *Fanout) Service() *Service { return &Service{local: f.opts.Local, m: f.m} }

// Changed implements clusterpb.EventsServer. IDs of the wrong length are
// ignored: they name no mailbox.
func (s *Service) Changed(ctx context.Context, req *clusterpb.ChangedRequest) (*clusterpb.ChangedReply, error) {
	for _, b := range req.GetMailboxes() {
		var id store.ID
		if len(b) != len(id) {
			continue
		}
		copy(id[:], b)
		s.local.Notify(id)
		s.m.received.Inc()
	}
	return &clusterpb.ChangedReply{}, nil
}

type metrics struct {
	sent, received, dropped, calls prometheus.Counter
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		sent: prometheus.NewCounter(prometheus.CounterOpts{Name: "quill_cluster_events_sent_total",
			Help: "Mailbox change events delivered to other nodes (one per mailbox per peer)."}),
		received: prometheus.NewCounter(prometheus.CounterOpts{Name: "quill_cluster_events_received_total",
			Help: "Mailbox change events received from other nodes."}),
		dropped: prometheus.NewCounter(prometheus.CounterOpts{Name: "quill_cluster_events_dropped_total",
			Help: "Mailbox change events not delivered to a peer (call failed, or too many pending); its sessions poll."}),
		calls: prometheus.NewCounter(prometheus.CounterOpts{Name: "quill_cluster_event_calls_total",
			Help: "Changed calls made to other nodes (each carries the events coalesced since the last)."}),
	}
	if reg != nil {
		reg.MustRegister(m.sent, m.received, m.dropped, m.calls)
	}
	return m
}
