package cluster

import (
	"context"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"quill/internal/cluster/clusterpb"
)

// Forwarded handles the mailbox writes other nodes forward to this one
// (internal/cluster/forward implements it over the local user manager).
// The Node service serves them through it and adds this node's load to
// each reply.
type Forwarded interface {
	Append(context.Context, *clusterpb.AppendRequest) (*clusterpb.AppendReply, error)
	SetFlags(context.Context, *clusterpb.SetFlagsRequest) (*clusterpb.SetFlagsReply, error)
	Expunge(context.Context, *clusterpb.ExpungeRequest) (*clusterpb.ExpungeReply, error)
	Move(context.Context, *clusterpb.MoveRequest) (*clusterpb.MoveReply, error)
	DeleteMailbox(context.Context, *clusterpb.DeleteMailboxRequest) (*clusterpb.DeleteMailboxReply, error)
	DeleteUser(context.Context, *clusterpb.DeleteUserRequest) (*clusterpb.DeleteUserReply, error)
}

// ServeForwarded installs the handler of forwarded writes, once the local
// user manager exists; until then they are refused as FAILED_PRECONDITION
// (nothing applied: the sender retries).
func (n *Node) ServeForwarded(f Forwarded) { n.fwd.Store(&f) }

var errNoHandler = status.Error(codes.FailedPrecondition, "cluster: this node does not take forwarded writes yet")

func (s *service) forwarded() (Forwarded, error) {
	f := s.n.fwd.Load()
	if f == nil {
		return nil, errNoHandler
	}
	return *f, nil
}

func (s *service) Append(ctx context.Context, req *clusterpb.AppendRequest) (*clusterpb.AppendReply, error) {
	f, err := s.forwarded()
	if err != nil {
		return nil, err
	}
	r, err := f.Append(ctx, req)
	if r != nil {
		r.Load = loadTo(s.n.currentLoad())
	}
	return r, err
}

func (s *service) SetFlags(ctx context.Context, req *clusterpb.SetFlagsRequest) (*clusterpb.SetFlagsReply, error) {
	f, err := s.forwarded()
	if err != nil {
		return nil, err
	}
	r, err := f.SetFlags(ctx, req)
	if r != nil {
		r.Load = loadTo(s.n.currentLoad())
	}
	return r, err
}

func (s *service) Expunge(ctx context.Context, req *clusterpb.ExpungeRequest) (*clusterpb.ExpungeReply, error) {
	f, err := s.forwarded()
	if err != nil {
		return nil, err
	}
	r, err := f.Expunge(ctx, req)
	if r != nil {
		r.Load = loadTo(s.n.currentLoad())
	}
	return r, err
}

func (s *service) Move(ctx context.Context, req *clusterpb.MoveRequest) (*clusterpb.MoveReply, error) {
	f, err := s.forwarded()
	if err != nil {
		return nil, err
	}
	r, err := f.Move(ctx, req)
	if r != nil {
		r.Load = loadTo(s.n.currentLoad())
	}
	return r, err
}

func (s *service) DeleteMailbox(ctx context.Context, req *clusterpb.DeleteMailboxRequest) (*clusterpb.DeleteMailboxReply, error) {
	f, err := s.forwarded()
	if err != nil {
		return nil, err
	}
	r, err := f.DeleteMailbox(ctx, req)
	if r != nil {
		r.Load = loadTo(s.n.currentLoad())
	}
	return r, err
}

func (s *service) DeleteUser(ctx context.Context, req *clusterpb.DeleteUserRequest) (*clusterpb.DeleteUserReply, error) {
	f, err := s.forwarded()
	if err != nil {
		return nil, err
	}
	r, err := f.DeleteUser(ctx, req)
	if r != nil {
		r.Load = loadTo(s.n.currentLoad())
	}
	return r, err
}
