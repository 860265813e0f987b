package delivery

import (
	"errors"

	"quill/internal/store"
)

// Errors from Resolve and Deliver. Each is permanent (5xx) unless stated;
// any other error is temporary (4xx). Protocol front ends map them to
// replies in one place each.
var (
	// ErrRelayDenied: the recipient's domain is not local (RFC 5321 section
	// 3.6.2: Quill is never an open relay).
	ErrRelayDenied = errors.New("delivery: relay access denied")
	// ErrOutboundDisabled: an authenticated submission to a remote domain;
	// outbound delivery is not implemented yet.
	ErrOutboundDisabled = errors.New("delivery: outbound delivery not enabled")
	// ErrNoSuchUser: local domain, but no such user or alias.
	ErrNoSuchUser = errors.New("delivery: no such user")
	// ErrOverQuota: the message would exceed the recipient's quota
	// (permanent: the message can never fit; see ErrMailboxFull).
	ErrOverQuota = errors.New("delivery: message exceeds quota")
	// ErrMailboxFull: the recipient is at quota now; temporary (452).
	ErrMailboxFull = errors.New("delivery: mailbox full")
	// ErrSenderNotAllowed: an authenticated user used an envelope sender that
	// is neither its address nor one of its aliases.
	ErrSenderNotAllowed = errors.New("delivery: sender address not owned by user")
	// ErrDisabled: the recipient account is disabled.
	ErrDisabled = errors.New("delivery: account disabled")
	// ErrOutcomeUnknown is store.ErrOutcomeUnknown: a recipient's result
	// (or Deliver's error) wrapping it means the message may or may not
	// have been stored for it; the front end must promise neither.
	ErrOutcomeUnknown = store.ErrOutcomeUnknown
)
