// Package delivery accepts one message for N local recipients: it resolves
// recipients (local domain, user or alias, quota), stores the body once and
// appends it to every recipient's INBOX, and reports per-recipient results.
// Deliver returns only after every success is durable: a front end may say
// 250 for exactly the recipients whose result is nil.
package delivery

import (
	"io"
	"time"

	"quill/internal/mail"
)

// Recipient is a resolved local recipient.
type Recipient struct {
	Address mail.Address // as the client gave it
	User    string       // the canonical user address (the store's key)
	// Quota is the user's quota (store.User.QuotaBytes) as Resolve read
	// it; the append checks against it without reading the user again.
	Quota int64
}

// ResolveOptions qualify a Resolve.
type ResolveOptions struct {
	// Authenticated is true on submission after AUTH: a remote recipient is
	// then ErrOutboundDisabled rather than ErrRelayDenied.
	Authenticated bool
	// Size is the SIZE= the client declared (RFC 1870), or 0.
	Size int64
}

// Message is one message to deliver.
type Message struct {
	ReturnPath mail.Address // the envelope sender; null for bounces
	Recipients []Recipient
	// Body is the whole message as it is to be stored, trace header fields
	// (Return-Path, Received) included. Deliver reads it to EOF; a read
	// error aborts the delivery and is returned wrapped.
	Body       io.Reader
	ReceivedAt time.Time
}
