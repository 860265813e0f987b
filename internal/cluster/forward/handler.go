package forward

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"quill/internal/cluster/clusterpb"
	"quill/internal/cluster/ownership"
	"quill/internal/store"
)

// Handler applies the writes other nodes forward to this one through the
// local user manager, each only while this node manages its user
// (Owner.Begin); otherwise it answers FAILED_PRECONDITION having applied
// nothing. Every status it answers carries an ErrorInfo detail (domain
// errorDomain) saying whether the write was refused (nothing applied),
// failed as the store error the code stands for, or is of unknown
// outcome (UNKNOWN), so that the sender tells the manager's answers from
// the statuses gRPC makes up for a call broken on the way. It implements cluster.Forwarded. The user a request names is
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
		return answer(codes.FailedPrecondition, reasonRefused, err.Error())
	}
	err = fn()
	derr := done()
	switch {
	case errors.Is(err, store.ErrOutcomeUnknown):
		h.applied.WithLabelValues(op, "error").Inc()
		return toStatus(err)
	case errors.Is(err, ownership.ErrNotManager), errors.Is(err, ownership.ErrHandoff), errors.Is(err, ownership.ErrNoLease):
		// The user manager's own check (usermgr.Owner) found the bucket
		// moved since Begin: nothing was applied.
		h.applied.WithLabelValues(op, "not_manager").Inc()
		return answer(codes.FailedPrecondition, reasonRefused, err.Error())
	case err != nil:
		h.applied.WithLabelValues(op, "error").Inc()
		return toStatus(err)
	case derr != nil:
		// Applied, but the lease lapsed before it completed: not
		// acknowledged, and not refused either (a successor's adoption
		// may or may not have fenced it).
		h.applied.WithLabelValues(op, "error").Inc()
		return answer(codes.Unknown, reasonUnknown, derr.Error())
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
		msgs[i] = store.NewMessage{Blob: blob, Size: m.Size, Flags: m.Flags, InternalDate: time.Unix(0, m.InternalDate).UTC(), Meta: m.Meta,
			FreshBlob: m.FreshBlob}
	}
	var out []store.Message
	err = h.apply("append", req.User, func() (err error) {
		out, err = h.local.Append(ctx, mb, msgs, store.AppendOptions{CheckQuota: req.CheckQuota, UserQuota: req.UserQuota})
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
		return nil, answer(codes.InvalidArgument, reasonFailed, fmt.Sprintf("flag operation %d", req.Op))
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
		return id, answer(codes.InvalidArgument, reasonFailed, fmt.Sprintf("an ID of %d bytes", len(b)))
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

// errorDomain is the ErrorInfo domain of the statuses Handler answers.
const errorDomain = "quill.forward"

// The ErrorInfo reasons: what the manager's answer says of the write.
const (
	reasonRefused = "REFUSED" // nothing applied; another attempt may succeed
	reasonFailed  = "FAILED"  // nothing applied; the code is the store error
	reasonUnknown = "UNKNOWN" // store.ErrOutcomeUnknown: applied or not, unknown
)

// answer is a status of the manager's own, with its ErrorInfo detail.
func answer(code codes.Code, reason, msg string) error {
	st := status.New(code, msg)
	if d, err := st.WithDetails(&errdetails.ErrorInfo{Domain: errorDomain, Reason: reason}); err == nil {
		st = d
	}
	return st.Err()
}

// answerReason returns the reason of st's ErrorInfo detail from the
// manager, or "" if it has none: a status gRPC made up, or one of an
// older node.
func answerReason(st *status.Status) string {
	for _, d := range st.Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok && info.GetDomain() == errorDomain {
			return info.GetReason()
		}
	}
	return ""
}

// Store errors on the wire: each classified error has its own code, so
// that the sender's caller classifies it as if the write were local.
// store.ErrUnavailable shares UNAVAILABLE with a broken connection and
// store.ErrOutcomeUnknown UNKNOWN with a failed handler: the detail tells
// them apart.
var errCodes = []struct {
	err    error
	code   codes.Code
	reason string
}{
	{store.ErrOutcomeUnknown, codes.Unknown, reasonUnknown},
	{store.ErrNotFound, codes.NotFound, reasonFailed},
	{store.ErrExists, codes.AlreadyExists, reasonFailed},
	{store.ErrOverQuota, codes.ResourceExhausted, reasonFailed},
	{store.ErrConflict, codes.Aborted, reasonFailed},
	{store.ErrInvalid, codes.InvalidArgument, reasonFailed},
	{store.ErrUnavailable, codes.Unavailable, reasonRefused},
}

// definiteCodes are the codes of errCodes that gRPC itself never makes up
// (grpc-go's doc/statuscodes.md): whoever sent them answered definitely,
// with or without the detail.
var definiteCodes = map[codes.Code]bool{
	codes.NotFound: true, codes.AlreadyExists: true, codes.Aborted: true, codes.InvalidArgument: true,
}

func toStatus(err error) error {
	for _, e := range errCodes {
		if errors.Is(err, e.err) {
			return answer(e.code, e.reason, err.Error())
		}
	}
	return answer(codes.Internal, reasonFailed, err.Error())
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
