// Package events fans a node's change events out to the nodes that watch
// them (docs/adr/0029, 0036): after its user manager makes a write durable,
// a node tells every other live node that has sessions on the mailbox
// (IMAP IDLE, or a selected mailbox) that it changed, and each wakes those
// sessions through its local hub. An event carries no data, only "this
// mailbox's change log grew": the woken session reads the log itself, so
// an event lost or duplicated costs latency, never correctness, and
// polling stays as the safety net.
//
// Interest: each node tells every other which mailboxes its sessions
// watch (Watch, Unwatch: mailbox.Hub calls them as a mailbox gains its first
// session and loses its last), as changes, with the whole set after a
// failed call or when the receiver asks (it restarted, or dropped the
// node from its view). Events then cost calls only towards nodes that
// watch, so the cost of a write does not grow with the cluster's size.
// A session's first event can be missed if the write lands before its
// node's watch reaches the writer (about a round trip); its poll then
// finds the change.
//
// Each peer has one sender goroutine with one call in flight; events and
// watch changes that arrive meanwhile coalesce into the next call, so the
// cost of a burst is one call per peer per round trip, not one per write.
// The set of events is bounded; past the bound events are dropped
// (counted).
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
	// Node is this node's ID, which peers key its watch set by.
	Node  string
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

	mu    sync.Mutex
	peers map[string]*sender // by peer ID
	// watched is this node's watch set; interest is each peer's, as the
	// peer told it (a peer absent has not sent its whole set since this
	// node started or dropped it).
	watched  map[store.ID]struct{}
	interest map[string]map[store.ID]struct{}
	closed   bool
	wg       sync.WaitGroup
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
	return &Fanout{opts: opts, m: newMetrics(opts.Registerer), peers: map[string]*sender{},
		watched: map[store.ID]struct{}{}, interest: map[string]map[store.ID]struct{}{}}
}

// Notify publishes that mailbox changed: to the local hub at once, and to
// every peer that watches it by its sender. It never blocks.
func (f *Fanout) Notify(mailbox store.ID) {
	f.opts.Local.Notify(mailbox)
	f.mu.Lock()
	defer f.mu.Unlock()
	for id, s := range f.peers {
		if _, ok := f.interest[id][mailbox]; ok {
			s.add(mailbox)
		}
	}
}

// Watch records that this node's sessions watch mailbox (the hub calls it
// as the mailbox gains its first session, Unwatch as it loses its last, in
// that order per mailbox), and queues the change for every peer. Neither
// blocks.
func (f *Fanout) Watch(mailbox store.ID) { f.setWatch(mailbox, true) }

// Unwatch records that they no longer do.
func (f *Fanout) Unwatch(mailbox store.ID) { f.setWatch(mailbox, false) }

func (f *Fanout) setWatch(mailbox store.ID, on bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if on {
		f.watched[mailbox] = struct{}{}
	} else {
		delete(f.watched, mailbox)
	}
	for _, s := range f.peers {
		s.watch(mailbox, on)
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
		s := &sender{f: f, peer: p, wake: make(chan struct{}, 1), quit: make(chan struct{}),
			pending: map[store.ID]struct{}{}, delta: map[store.ID]bool{}, full: true, ask: true}
		f.peers[p.ID] = s
		f.wg.Add(1)
		go s.run()
		s.poke()
	}
	for id, s := range f.peers {
		if !keep[id] {
			s.stop()
			delete(f.peers, id)
		}
	}
	// The watch set of a node not listed is stale from now on: one listed
	// dead by mistake is asked for its whole set when listed again.
	for id := range f.interest {
		if !keep[id] {
			delete(f.interest, id)
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
	// delta is this node's watch changes not yet sent (true: watch);
	// full says to send the whole watch set instead.
	delta map[store.ID]bool
	full  bool
	// ask: make a call even with nothing queued, to ask the peer for its
	// whole watch set (this node has none of it).
	ask bool
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
	s.poke()
}

// watch queues a change of this node's watch set (Fanout.mu is held).
func (s *sender) watch(id store.ID, on bool) {
	s.mu.Lock()
	if !s.full {
		if len(s.delta) >= s.f.opts.MaxPending {
			s.full, s.delta = true, map[store.ID]bool{}
		} else {
			s.delta[id] = on
		}
	}
	s.mu.Unlock()
	s.poke()
}

// resync makes the next call carry the whole watch set.
func (s *sender) resync() {
	s.mu.Lock()
	s.full = true
	clear(s.delta)
	s.mu.Unlock()
	s.poke()
}

func (s *sender) poke() {
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
		if req := s.next(); req != nil && !s.send(ctx, req) {
			// The peer failed: the whole set goes in the next call,
			// tried after a pause (it may be gone, until membership
			// says so), with whatever came meanwhile.
			s.resync()
			t := time.NewTimer(retryPause)
			select {
			case <-s.quit:
				t.Stop()
				return
			case <-t.C:
			}
		}
	}
}

// retryPause is how long a sender waits after a failed call.
const retryPause = time.Second

// next takes the events and watch changes queued for the peer, or returns
// nil if there are none.
func (s *sender) next() *clusterpb.ChangedRequest {
	s.f.mu.Lock() // the watch set, when full: Fanout.mu before sender.mu
	defer s.f.mu.Unlock()
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.pending) == 0 && len(s.delta) == 0 && !s.full && !s.ask {
		return nil
	}
	s.ask = false
	_, known := s.f.interest[s.peer.ID]
	req := &clusterpb.ChangedRequest{Node: s.f.opts.Node, Full: s.full, WantFull: !known}
	req.Mailboxes = make([][]byte, 0, len(s.pending))
	for id := range s.pending {
		req.Mailboxes = append(req.Mailboxes, id[:])
	}
	clear(s.pending)
	if s.full {
		for id := range s.f.watched {
			req.Watch = append(req.Watch, id[:])
		}
	} else {
		for id, on := range s.delta {
			if on {
				req.Watch = append(req.Watch, id[:])
			} else {
				req.Unwatch = append(req.Unwatch, id[:])
			}
		}
	}
	s.full = false
	clear(s.delta)
	return req
}

// send makes one Changed call and reports whether it succeeded. A failure
// drops its events (the peer's sessions still poll) and is logged at debug
// level, since a peer that just died fails until membership notices.
func (s *sender) send(ctx context.Context, req *clusterpb.ChangedRequest) bool {
	conn, err := s.f.opts.Dial(s.peer.ID, s.peer.Addr)
	var reply *clusterpb.ChangedReply
	if err == nil {
		cctx, cancel := context.WithTimeout(ctx, s.f.opts.CallTimeout)
		reply, err = clusterpb.NewEventsClient(conn).Changed(cctx, req)
		cancel()
	}
	n := float64(len(req.Mailboxes))
	if err != nil {
		s.f.m.dropped.Add(n)
		s.f.opts.Logger.Debug("cluster: change events not delivered", "peer", s.peer.ID, "events", n, "err", err)
		return false
	}
	s.f.m.sent.Add(n)
	s.f.m.calls.Inc()
	if reply.GetResync() {
		s.resync()
	}
	return true
}

// Service is the Events RPC service: it keeps each peer's watch set and
// hands every mailbox a peer says changed to the local hub.
type Service struct {
	clusterpb.UnimplementedEventsServer
	f *Fanout
}

// Service returns f's RPC service, to register on the node's gRPC server.
func (f *Fanout) Service() *Service { return &Service{f: f} }

// Changed implements clusterpb.EventsServer. IDs of the wrong length are
// ignored: they name no mailbox.
func (s *Service) Changed(ctx context.Context, req *clusterpb.ChangedRequest) (*clusterpb.ChangedReply, error) {
	reply := &clusterpb.ChangedReply{}
	if node := req.GetNode(); node != "" && node != s.f.opts.Node {
		reply.Resync = s.f.peerWatches(node, req.GetFull(), req.GetWatch(), req.GetUnwatch())
		if req.GetWantFull() {
			s.f.sendWhole(node)
		}
	}
	for _, b := range req.GetMailboxes() {
		if id, ok := idOf(b); ok {
			s.f.opts.Local.Notify(id)
			s.f.m.received.Inc()
		}
	}
	return reply, nil
}

// peerWatches applies a peer's watch set (full) or changes to it, and
// reports whether the peer must send its whole set: changes to a set this
// node does not keep are not applied.
func (f *Fanout) peerWatches(node string, full bool, watch, unwatch [][]byte) (resync bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	set, ok := f.interest[node]
	switch {
	case full:
		set = make(map[store.ID]struct{}, len(watch))
		f.interest[node] = set
	case !ok:
		return true
	}
	for _, b := range watch {
		if id, ok := idOf(b); ok {
			set[id] = struct{}{}
		}
	}
	for _, b := range unwatch {
		if id, ok := idOf(b); ok {
			delete(set, id)
		}
	}
	return false
}

// sendWhole makes the next call to node carry the whole watch set (if node
// is not yet a peer, its sender starts with it).
func (f *Fanout) sendWhole(node string) {
	f.mu.Lock()
	s := f.peers[node]
	f.mu.Unlock()
	if s != nil {
		s.resync()
	}
}

func idOf(b []byte) (store.ID, bool) {
	var id store.ID
	if len(b) != len(id) {
		return id, false
	}
	copy(id[:], b)
	return id, true
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
