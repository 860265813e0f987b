// Package forward sends each user's mailbox writes to the user's manager
// (docs/adr/0027; the cluster issue's item 5). Store is the store.Store a
// clustered node's front ends and services use: reads, the directory and
// blobs go straight to the local store; a mailbox write (Append, SetFlags,
// Expunge, Move, DeleteMailbox, DeleteUser) goes to the local user manager
// when this node manages the user now (ownership.Owner.Begin), and
// otherwise to the manager node over the cluster's RPC channel, where
// Handler applies it through that node's own user manager. Bodies never
// travel: an inline body is stored here first (PutBlob) and only its blob
// ID is sent.
//
// A write refused before anything of it was applied (the manager said so:
// it no longer manages the user, its bucket is in handoff, its store is
// unavailable; or the call never left this node: no connection could be
// made) is retried against the newest view of who manages the user until
// Options.Timeout; then it fails with ErrManagerUnreachable, which wraps
// store.ErrUnavailable (a temporary failure for the client). A
// delivery's append (store.AppendOptions.Deferrable) that meets it after
// Options.PendingAfter, with Options.Pending set, has applied nothing and
// is recorded as a pending delivery instead (ADR 0034; the cluster
// issue's item 6): its body stored here, a durable record in the user's
// bucket, which the bucket's manager applies (internal/cluster/pending).
//
// A call that may have reached the manager and got no answer of the
// manager's own (the connection broke, the deadline passed) is never
// retried, here or at another node: it fails with ErrOutcomeUnknown, which
// wraps store.ErrOutcomeUnknown, and so does a write the manager itself
// reports of unknown outcome (docs/adr/0030).
package forward

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"quill/internal/cluster/clusterpb"
	"quill/internal/cluster/ownership"
	"quill/internal/cluster/usermap"
	"quill/internal/store"
)

// DefaultTimeout bounds a forwarded write, retries included.
const DefaultTimeout = 5 * time.Second

// DefaultPendingAfter bounds a deferrable append's attempts to reach the
// manager before it is recorded as a pending delivery.
const DefaultPendingAfter = time.Second

// ErrManagerUnreachable: the user's manager could not be reached within
// the bound, or kept refusing; nothing of the write was applied.
var ErrManagerUnreachable = fmt.Errorf("forward: the user's manager could not be reached in time: %w", store.ErrUnavailable)

// ErrOutcomeUnknown: the manager may have applied the write (it was asked
// and did not answer, or answered that the outcome is unknown).
var ErrOutcomeUnknown = fmt.Errorf("forward: the user's manager may or may not have applied the write: %w", store.ErrOutcomeUnknown)

// Local is the local user manager (usermgr.Manager): the store the writes
// of users this node manages go to, and reads always.
type Local interface {
	store.Store
	Move(ctx context.Context, from store.ID, uids []uint32, to store.ID) (src, dst []uint32, err error)
	SetMeta(ctx context.Context, mailbox store.ID, metas map[uint32][]byte) error
}

// Owner says whether this node manages a user now (ownership.Owner).
type Owner interface {
	Begin(user string) (epoch uint64, done func() error, err error)
}

// Peers reaches other nodes (cluster.Node).
type Peers interface {
	Client(id string) (clusterpb.NodeClient, error)
}

// Notifier hears of mailboxes changed through another node's manager
// (mailbox.Hub), so that this node's sessions see their own writes at
// once.
type Notifier interface {
	Notify(mailbox store.ID)
}

// Options configure New.
type Options struct {
	Local Local
	Owner Owner
	Peers Peers
	// Timeout bounds a forwarded write (DefaultTimeout when zero).
	Timeout time.Duration
	// Pending, if set, records the deferrable appends whose manager is
	// not reached within PendingAfter (DefaultPendingAfter when zero).
	Pending      store.PendingDeliveries
	PendingAfter time.Duration
	Notifier     Notifier // may be nil
	Logger       *slog.Logger
	Registerer   prometheus.Registerer // may be nil
}

// Store routes mailbox writes to the user's manager; everything else is
// the local store's. It is safe for concurrent use.
type Store struct {
	Local
	owner   Owner
	peers   Peers
	timeout time.Duration
	pending store.PendingDeliveries
	pendAft time.Duration
	notify  Notifier
	log     *slog.Logger
	sent    *prometheus.CounterVec

	mu     sync.Mutex
	owners map[store.ID]string // mailbox -> user (mailbox IDs are never reused)
}

var _ store.Store = (*Store)(nil)

// New returns the routing store.
func New(opts Options) (*Store, error) {
	if opts.Local == nil || opts.Owner == nil || opts.Peers == nil {
		return nil, errors.New("forward: no local store, owner or peers")
	}
	if opts.Timeout <= 0 {
		opts.Timeout = DefaultTimeout
	}
	if opts.PendingAfter <= 0 {
		opts.PendingAfter = DefaultPendingAfter
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	s := &Store{Local: opts.Local, owner: opts.Owner, peers: opts.Peers, timeout: opts.Timeout,
		pending: opts.Pending, pendAft: min(opts.PendingAfter, opts.Timeout),
		notify: opts.Notifier, log: opts.Logger, owners: map[store.ID]string{},
		sent: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "quill_cluster_forwarded_total",
			Help: "Mailbox writes this node sent to the user's manager on another node, by operation and result (ok, refused: a store error, unreachable, unknown, pending: recorded as a pending delivery).",
		}, []string{"op", "result"}),
	}
	if opts.Registerer != nil {
		if err := opts.Registerer.Register(s.sent); err != nil {
			return nil, err
		}
	}
	return s, nil
}

// userOf returns the user owning mailbox.
func (s *Store) userOf(ctx context.Context, mailbox store.ID) (string, error) {
	s.mu.Lock()
	user, ok := s.owners[mailbox]
	s.mu.Unlock()
	if ok {
		return user, nil
	}
	mb, err := s.Local.GetMailboxByID(ctx, mailbox)
	if err != nil {
		return "", err
	}
	s.mu.Lock()
	if len(s.owners) >= 1<<16 {
		clear(s.owners)
	}
	s.owners[mailbox] = mb.User
	s.mu.Unlock()
	return mb.User, nil
}

// KnownRoom is the local manager's (delivery.RoomKnower): it knows the
// usage of the users this node manages, and of no other.
func (s *Store) KnownRoom(user string, quota, size int64) (room, known bool) {
	if k, ok := s.Local.(interface {
		KnownRoom(user string, quota, size int64) (room, known bool)
	}); ok {
		return k.KnownRoom(user, quota, size)
	}
	return false, false
}

// route runs a write of user's: local while this node manages user, else
// remote against the manager's client, retrying refusals until the bound.
func (s *Store) route(ctx context.Context, op, user string, bound time.Duration, local func(context.Context) error,
	remote remoteCall) error {
	// bound limits the retries of refused attempts; a call that went out
	// has the whole timeout, as any other forwarded write: cutting it
	// short would leave its outcome unknown.
	start := time.Now()
	deadline, callDeadline := start.Add(bound), start.Add(s.timeout)
	wait := 5 * time.Millisecond
	var last error
	for {
		_, done, err := s.owner.Begin(user)
		if err == nil {
			err = local(ctx)
			derr := done()
			switch {
			case err == nil && derr != nil:
				// Applied, but the lease lapsed before it completed: not
				// acknowledged (ADR 0024), and not refused either, for a
				// successor's adoption may or may not have fenced it.
				return fmt.Errorf("%w: %s for %s: %v", ErrOutcomeUnknown, op, user, derr)
			case errors.Is(err, ownership.ErrNotManager), errors.Is(err, ownership.ErrHandoff), errors.Is(err, ownership.ErrNoLease):
				// The user manager asked the owner itself (usermgr.Owner)
				// and the bucket moved since Begin: nothing was applied.
			default:
				return err
			}
		}
		var nm *ownership.NotManagerError
		if errors.As(err, &nm) {
			err = s.remote(ctx, op, nm.Manager, callDeadline, remote)
			if err == nil || !errors.Is(err, errRefused) {
				return err
			}
		} else if errors.Is(err, ownership.ErrClosed) {
			return fmt.Errorf("forward: %s for %s: %w", op, user, err)
		}
		last = err
		if ctx.Err() != nil || time.Until(deadline) < wait {
			s.sent.WithLabelValues(op, "unreachable").Inc()
			return fmt.Errorf("%w: %s for %s: %w", ErrManagerUnreachable, op, user, last)
		}
		select {
		case <-ctx.Done():
		case <-time.After(wait):
		}
		wait = min(2*wait, 100*time.Millisecond)
	}
}

// errRefused marks a remote failure that applied nothing and may be
// retried (the manager changed, or could not be reached).
var errRefused = errors.New("refused")

// remoteCall makes one forwarded call with the given call options.
type remoteCall func(ctx context.Context, c clusterpb.NodeClient, opts ...grpc.CallOption) error

// remote makes one remote attempt at node before deadline, and classifies
// its failure (docs/adr/0030):
//
//   - refused, applied nothing (errRefused, retried by route): no client
//     for the node; the call never went out on a connection (grpc.Peer
//     unset: grpc-go fills it in only once the call has a stream on a
//     transport, and itself retries transparently a stream the server
//     never processed); the manager's own refusal (FAILED_PRECONDITION, or
//     a status carrying the handler's refused detail);
//   - the manager's answer (a status with the handler's detail, or a code
//     gRPC never makes up): the store error it stands for, or
//     ErrOutcomeUnknown where the manager did not know either;
//   - anything else, once the call went out (the connection broke:
//     UNAVAILABLE or CANCELED from the transport; DEADLINE_EXCEEDED; a
//     status without the detail): ErrOutcomeUnknown, never retried.
func (s *Store) remote(ctx context.Context, op, node string, deadline time.Time, call remoteCall) error {
	c, err := s.peers.Client(node)
	if err != nil {
		return fmt.Errorf("%w: %w", errRefused, err)
	}
	actx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()
	var p peer.Peer
	err = call(actx, c, grpc.Peer(&p))
	if err == nil {
		s.sent.WithLabelValues(op, "ok").Inc()
		return nil
	}
	st, isStatus := status.FromError(err)
	if !isStatus {
		return err // failed here, before the call (storing a body), or wraps ErrOutcomeUnknown
	}
	reached := p.Addr != nil
	reason := answerReason(st)
	switch {
	case st.Code() == codes.FailedPrecondition, reason == reasonRefused,
		reason == "" && st.Code() == codes.Unimplemented:
		// The manager (or a node without the method) applied nothing.
		return fmt.Errorf("%w: node %s: %w", errRefused, node, err)
	case reason == reasonUnknown:
	case reason != "" || definiteCodes[st.Code()]:
		s.sent.WithLabelValues(op, "refused").Inc()
		return fromStatus(err)
	case !reached:
		if ctx.Err() != nil {
			return ctx.Err()
		}
		// Never sent: as good as a refusal.
		return fmt.Errorf("%w: node %s, not sent: %w", errRefused, node, err)
	}
	s.sent.WithLabelValues(op, "unknown").Inc()
	return fmt.Errorf("%w: %s at node %s: %w", ErrOutcomeUnknown, op, node, err)
}

func (s *Store) published(mailboxes ...store.ID) {
	if s.notify == nil {
		return
	}
	for _, id := range mailboxes {
		s.notify.Notify(id)
	}
}

// Append implements store.Store. Forwarded, an inline body is stored
// here first and travels as its blob ID.
func (s *Store) Append(ctx context.Context, mailbox store.ID, msgs []store.NewMessage, opts store.AppendOptions) ([]store.Message, error) {
	user, err := s.userOf(ctx, mailbox)
	if err != nil {
		return nil, fmt.Errorf("mailbox %s: %w", mailbox, err)
	}
	var out []store.Message
	var req *clusterpb.AppendRequest
	bound := s.timeout
	deferrable := opts.Deferrable && s.pending != nil
	if deferrable {
		bound = s.pendAft
	}
	err = s.route(ctx, "append", user, bound, func(ctx context.Context) error {
		out, err = s.Local.Append(ctx, mailbox, msgs, opts)
		return err
	}, func(ctx context.Context, c clusterpb.NodeClient, copts ...grpc.CallOption) error {
		if req == nil {
			if req, err = s.appendRequest(ctx, user, mailbox, msgs, opts); err != nil {
				return err
			}
		}
		r, err := c.Append(ctx, req, copts...)
		if err != nil {
			return err
		}
		if len(r.Messages) != len(msgs) {
			// Applied, by all appearances, but not as asked.
			return fmt.Errorf("%w: append of %d messages answered with %d", ErrOutcomeUnknown, len(msgs), len(r.Messages))
		}
		out = make([]store.Message, len(r.Messages))
		for i, m := range r.Messages {
			out[i] = messageFrom(m)
			out[i].Meta = msgs[i].Meta
		}
		s.published(mailbox)
		return nil
	})
	if deferrable && errors.Is(err, ErrManagerUnreachable) {
		return s.deferAppend(ctx, user, mailbox, msgs, req)
	}
	if err != nil {
		return nil, err
	}
	return out, nil
}

// deferAppend records msgs as pending deliveries to mailbox of user's
// (ADR 0034), storing inline bodies first unless req, the append request
// an earlier attempt built, stored them already. It returns the messages
// with UID 0.
func (s *Store) deferAppend(ctx context.Context, user string, mailbox store.ID, msgs []store.NewMessage, req *clusterpb.AppendRequest) ([]store.Message, error) {
	out := make([]store.Message, len(msgs))
	for i, nm := range msgs {
		blob := nm.Blob
		switch {
		case req != nil:
			blob = store.ID(req.Messages[i].Blob)
		case nm.Body != nil:
			id, _, err := s.Local.PutBlob(ctx, bytesReader(nm.Body), int64(len(nm.Body)))
			if err != nil {
				return nil, fmt.Errorf("forward: storing a pending delivery's body: %w", err)
			}
			blob = id
		}
		p := store.PendingDelivery{Bucket: usermap.Bucket(user), At: time.Now().UnixNano(), ID: store.NewID(),
			User: user, Mailbox: mailbox, Blob: blob, Size: nm.Size, Flags: nm.Flags,
			InternalDate: nm.InternalDate, Meta: nm.Meta}
		if err := s.pending.PutPending(ctx, p); err != nil {
			return nil, fmt.Errorf("forward: recording a pending delivery for %s: %w", user, err)
		}
		s.sent.WithLabelValues("append", "pending").Inc()
		s.log.Info("delivery recorded as pending: the user's manager was not reached", "user", user, "bucket", p.Bucket)
		out[i] = store.Message{Flags: nm.Flags, InternalDate: nm.InternalDate, Size: nm.Size, Blob: blob, Meta: nm.Meta}
	}
	return out, nil
}

// appendRequest builds the forwarded append, storing inline bodies first.
func (s *Store) appendRequest(ctx context.Context, user string, mailbox store.ID, msgs []store.NewMessage, opts store.AppendOptions) (*clusterpb.AppendRequest, error) {
	req := &clusterpb.AppendRequest{User: user, Mailbox: mailbox[:], CheckQuota: opts.CheckQuota, UserQuota: opts.UserQuota,
		Messages: make([]*clusterpb.NewMessage, len(msgs))}
	for i, nm := range msgs {
		if err := nm.Check(); err != nil {
			return nil, err
		}
		blob, fresh := nm.Blob, nm.FreshBlob
		if nm.Body != nil {
			id, _, err := s.Local.PutBlob(ctx, bytesReader(nm.Body), int64(len(nm.Body)))
			if err != nil {
				return nil, fmt.Errorf("forward: storing a body: %w", err)
			}
			blob, fresh = id, true
		}
		req.Messages[i] = &clusterpb.NewMessage{Blob: blob[:], Size: nm.Size, Flags: nm.Flags,
			InternalDate: nm.InternalDate.UnixNano(), Meta: nm.Meta, FreshBlob: fresh}
	}
	return req, nil
}

// SetFlags implements store.Store.
func (s *Store) SetFlags(ctx context.Context, mailbox store.ID, change store.FlagChange) (store.FlagResult, error) {
	user, err := s.userOf(ctx, mailbox)
	if err != nil {
		return store.FlagResult{}, fmt.Errorf("mailbox %s: %w", mailbox, err)
	}
	var res store.FlagResult
	err = s.route(ctx, "set_flags", user, s.timeout, func(ctx context.Context) error {
		res, err = s.Local.SetFlags(ctx, mailbox, change)
		return err
	}, func(ctx context.Context, c clusterpb.NodeClient, copts ...grpc.CallOption) error {
		r, err := c.SetFlags(ctx, &clusterpb.SetFlagsRequest{User: user, Mailbox: mailbox[:], Uids: change.UIDs,
			Op: uint32(change.Op), Flags: change.Flags, UnchangedSince: change.UnchangedSince}, copts...)
		if err != nil {
			return err
		}
		res = store.FlagResult{Failed: r.Failed}
		for _, m := range r.Changed {
			res.Changed = append(res.Changed, messageFrom(m))
		}
		if len(res.Changed) > 0 {
			s.published(mailbox)
		}
		return nil
	})
	return res, err
}

// Expunge implements store.Store.
func (s *Store) Expunge(ctx context.Context, mailbox store.ID, uids []uint32) ([]uint32, uint64, error) {
	user, err := s.userOf(ctx, mailbox)
	if err != nil {
		return nil, 0, fmt.Errorf("mailbox %s: %w", mailbox, err)
	}
	var (
		gone   []uint32
		modseq uint64
	)
	err = s.route(ctx, "expunge", user, s.timeout, func(ctx context.Context) error {
		gone, modseq, err = s.Local.Expunge(ctx, mailbox, uids)
		return err
	}, func(ctx context.Context, c clusterpb.NodeClient, copts ...grpc.CallOption) error {
		r, err := c.Expunge(ctx, &clusterpb.ExpungeRequest{User: user, Mailbox: mailbox[:], Uids: uids}, copts...)
		if err != nil {
			return err
		}
		gone, modseq = r.Expunged, r.Modseq
		if len(gone) > 0 {
			s.published(mailbox)
		}
		return nil
	})
	return gone, modseq, err
}

// Move moves messages between two mailboxes of one user at the user's
// manager (usermgr.Manager.Move).
func (s *Store) Move(ctx context.Context, from store.ID, uids []uint32, to store.ID) (src, dst []uint32, err error) {
	user, err := s.userOf(ctx, from)
	if err != nil {
		return nil, nil, fmt.Errorf("mailbox %s: %w", from, err)
	}
	err = s.route(ctx, "move", user, s.timeout, func(ctx context.Context) error {
		src, dst, err = s.Local.Move(ctx, from, uids, to)
		return err
	}, func(ctx context.Context, c clusterpb.NodeClient, copts ...grpc.CallOption) error {
		r, err := c.Move(ctx, &clusterpb.MoveRequest{User: user, From: from[:], Uids: uids, To: to[:]}, copts...)
		if err != nil {
			return err
		}
		src, dst = r.Src, r.Dst
		if len(src) > 0 {
			s.published(from, to)
		}
		return nil
	})
	return src, dst, err
}

// DeleteMailbox implements store.Store.
func (s *Store) DeleteMailbox(ctx context.Context, user, name string) error {
	return s.route(ctx, "delete_mailbox", user, s.timeout, func(ctx context.Context) error {
		return s.Local.DeleteMailbox(ctx, user, name)
	}, func(ctx context.Context, c clusterpb.NodeClient, copts ...grpc.CallOption) error {
		_, err := c.DeleteMailbox(ctx, &clusterpb.DeleteMailboxRequest{User: user, Name: name}, copts...)
		return err
	})
}

// DeleteUser implements store.Store.
func (s *Store) DeleteUser(ctx context.Context, address string) error {
	return s.route(ctx, "delete_user", address, s.timeout, func(ctx context.Context) error {
		return s.Local.DeleteUser(ctx, address)
	}, func(ctx context.Context, c clusterpb.NodeClient, copts ...grpc.CallOption) error {
		_, err := c.DeleteUser(ctx, &clusterpb.DeleteUserRequest{User: address}, copts...)
		return err
	})
}
