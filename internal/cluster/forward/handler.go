package forward

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"quill/internal/cluster/clusterpb"
	"quill/internal/cluster/ownership"
	"quill/internal/store"
)

// Handler applies the writes other nodes forward to this one through the
// local user manager, each only while this node manages its user
// (Owner.Begin); otherwise it answers FAILED_PRECONDITION having applied
// nothing. It implements cluster.Forwarded. The user a request names is
// the sender's reading of the mailbox's owner; the user manager itself
// refuses a mailbox of another user where it builds batches.
type Handler struct {
	local   Local
	owner   Owner
	applied *prometheus.CounterVec
}

// NewHandler returns the handler over the local user manager.
func NewHandler(local Local, owner Owner, reg prometheus.Registerer) (*Handler, error) {
	h := &Handler{local: local, owner: owner, applied: prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "quill_cluster_forwarded_applied_total",
		Help: "Mailbox writes other nodes forwarded to this node, by operation and result (ok, not_manager, error).",
	}, []string{"op", "result"})}
	if reg != nil {
		if err := reg.Register(h.applied); err != nil {
			return nil, err
		}
	}
	return h, nil
}

// apply runs fn for user while this node manages it.
func (h *Handler) apply(op, user string, fn func() error) error {
	_, done, err := h.owner.Begin(user)
	if err != nil {
		h.applied.WithLabelValues(op, "not_manager").Inc()
		return status.Error(codes.FailedPrecondition, err.Error())
	}
	err = fn()
	derr := done()
	switch {
	case errors.Is(err, ownership.ErrNotManager), errors.Is(err, ownership.ErrHandoff), errors.Is(err, ownership.ErrNoLease):
		// The user manager's own check (usermgr.Owner) found the bucket
		// moved since Begin: nothing was applied.
		h.applied.WithLabelValues(op, "not_manager").Inc()
		return status.Error(codes.FailedPrecondition, err.Error())
	case err != nil:
		h.applied.WithLabelValues(op, "error").Inc()
		return toStatus(err)
	case derr != nil:
		// Applied, but the lease lapsed before it completed: not
		// acknowledged, and the outcome is the sender's to doubt.
		h.applied.WithLabelValues(op, "error").Inc()
		return status.Error(codes.Internal, derr.Error())
	}
	h.applied.WithLabelValues(op, "ok").Inc()
	return nil
}

func (h *Handler) Append(ctx context.Context, req *clusterpb.AppendRequest) (*clusterpb.AppendReply, error) {
	mb, err := idFrom(req.Mailbox)
	if err != nil {
		return nil, err
	}
	msgs := make([]store.NewMessage, len(req.Messages))
	for i, m := range req.Messages {
		blob, err := idFrom(m.Blob)
		if err != nil {
			return nil, err
		}
		msgs[i] = store.NewMessage{Blob: blob, Size: m.Size, Flags: m.Flags, InternalDate: time.Unix(0, m.InternalDate).UTC(), Meta: m.Meta}
	}
	var out []store.Message
	err = h.apply("append", req.User, func() (err error) {
		out, err = h.local.Append(ctx, mb, msgs, store.AppendOptions{CheckQuota: req.CheckQuota})
		return err
	})
	if err != nil {
		return nil, err
	}
	r := &clusterpb.AppendReply{Messages: make([]*clusterpb.Message, len(out))}
	for i, m := range out {
		r.Messages[i] = messageTo(m)
	}
	return r, nil
}

func (h *Handler) SetFlags(ctx context.Context, req *clusterpb.SetFlagsRequest) (*clusterpb.SetFlagsReply, error) {
	mb, err := idFrom(req.Mailbox)
	if err != nil {
		return nil, err
	}
	if req.Op > uint32(store.FlagsRemove) {
		return nil, status.Errorf(codes.InvalidArgument, "flag operation %d", req.Op)
	}
	var res store.FlagResult
	err = h.apply("set_flags", req.User, func() (err error) {
		res, err = h.local.SetFlags(ctx, mb, store.FlagChange{UIDs: req.Uids, Op: store.FlagOp(req.Op), Flags: req.Flags,
			UnchangedSince: req.UnchangedSince})
		return err
	})
	if err != nil {
		return nil, err
	}
	r := &clusterpb.SetFlagsReply{Failed: res.Failed}
	for _, m := range res.Changed {
		r.Changed = append(r.Changed, messageTo(m))
	}
	return r, nil
}

func (h *Handler) Expunge(ctx context.Context, req *clusterpb.ExpungeRequest) (*clusterpb.ExpungeReply, error) {
	mb, err := idFrom(req.Mailbox)
	if err != nil {
		return nil, err
	}
	r := &clusterpb.ExpungeReply{}
	err = h.apply("expunge", req.User, func() (err error) {
		r.Expunged, r.Modseq, err = h.local.Expunge(ctx, mb, req.Uids)
		return err
	})
	if err != nil {
		return nil, err
	}
	return r, nil
}

func (h *Handler) Move(ctx context.Context, req *clusterpb.MoveRequest) (*clusterpb.MoveReply, error) {
	from, err := idFrom(req.From)
	if err != nil {
		return nil, err
	}
	to, err := idFrom(req.To)
	if err != nil {
		return nil, err
	}
	r := &clusterpb.MoveReply{}
	err = h.apply("move", req.User, func() (err error) {
		r.Src, r.Dst, err = h.local.Move(ctx, from, req.Uids, to)
		return err
	})
	if err != nil {
		return nil, err
	}
	return r, nil
}

func (h *Handler) DeleteMailbox(ctx context.Context, req *clusterpb.DeleteMailboxRequest) (*clusterpb.DeleteMailboxReply, error) {
	err := h.apply("delete_mailbox", req.User, func() error { return h.local.DeleteMailbox(ctx, req.User, req.Name) })
	if err != nil {
		return nil, err
	}
	return &clusterpb.DeleteMailboxReply{}, nil
}

func (h *Handler) DeleteUser(ctx context.Context, req *clusterpb.DeleteUserRequest) (*clusterpb.DeleteUserReply, error) {
	err := h.apply("delete_user", req.User, func() error { return h.local.DeleteUser(ctx, req.User) })
	if err != nil {
		return nil, err
	}
	return &clusterpb.DeleteUserReply{}, nil
}

// idFrom parses an ID sent by another node.
func idFrom(b []byte) (store.ID, error) {
	var id store.ID
	if len(b) != len(id) {
		return id, status.Errorf(codes.InvalidArgument, "an ID of %d bytes", len(b))
	}
	copy(id[:], b)
	return id, nil
}

func messageTo(m store.Message) *clusterpb.Message {
	return &clusterpb.Message{Uid: m.UID, Modseq: m.ModSeq, Flags: m.Flags, InternalDate: m.InternalDate.UnixNano(),
		Size: m.Size, Blob: m.Blob[:]}
}

func messageFrom(m *clusterpb.Message) store.Message {
	var blob store.ID
	copy(blob[:], m.Blob)
	return store.Message{UID: m.Uid, ModSeq: m.Modseq, Flags: m.Flags, InternalDate: time.Unix(0, m.InternalDate).UTC(),
		Size: m.Size, Blob: blob}
}

// Store errors on the wire: each classified error has its own code, so
// that the sender's caller classifies it as if the write were local.
var errCodes = []struct {
	err  error
	code codes.Code
}{
	{store.ErrNotFound, codes.NotFound},
	{store.ErrExists, codes.AlreadyExists},
	{store.ErrOverQuota, codes.ResourceExhausted},
	{store.ErrConflict, codes.Aborted},
	{store.ErrInvalid, codes.InvalidArgument},
	{store.ErrUnavailable, codes.Unavailable},
}

func toStatus(err error) error {
	for _, e := range errCodes {
		if errors.Is(err, e.err) {
			return status.Error(e.code, err.Error())
		}
	}
	return status.Error(codes.Internal, err.Error())
}

// fromStatus turns a manager's error back into the store's.
func fromStatus(err error) error {
	st, ok := status.FromError(err)
	if !ok {
		return err
	}
	for _, e := range errCodes {
		if st.Code() == e.code {
			return fmt.Errorf("forward: at the user's manager: %s: %w", st.Message(), e.err)
		}
	}
	return errors.New("forward: at the user's manager: " + st.Message())
}

func bytesReader(b []byte) io.Reader { return bytes.NewReader(b) }
