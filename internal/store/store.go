// Package store defines the storage contracts: Engine, what a storage
// engine provides (users and aliases, mailboxes with their IMAP counters,
// messages, shared body blobs, a per-mailbox change log, quota usage),
// Batch and BatchWriter, the already-ordered writes a user manager hands
// an engine (ADR 0023), and Store, an Engine with ordered mailbox writes,
// which the layers above use (internal/usermgr implements it). Engines live
// beneath it (embedded/, cassandra/) and all pass the conformance suite in
// storetest, through the user manager.
//
// Invariants every Store upholds, whatever the number of processes using
// it at once (an engine may not rely on one process holding locks):
//
//   - Within a mailbox, UIDs and MODSEQs are strictly increasing in the order
//     in which any reader can observe them, and a UID is never reused under
//     one UIDVALIDITY.
//   - A successful Append, SetFlags or Expunge is durable when it returns,
//     and so is a batch whose BatchWriter wait returned nil. One that fails
//     with an error other than ErrOutcomeUnknown applied nothing.
//   - A blob is deleted only after the last message referencing it is gone.
//   - A mailbox's change log holds every change above its ExpungeFloor:
//     each present message's latest change, and each expunge.
package store

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"time"
)

// Errors, classified for callers with errors.Is. Engines wrap them with %w.
var (
	ErrNotFound = errors.New("store: not found")
	ErrExists   = errors.New("store: already exists")
	// ErrOverQuota: an Append with CheckQuota would exceed the user's quota.
	ErrOverQuota = errors.New("store: over quota")
	// ErrConflict: a concurrent change made the operation invalid (for
	// example a mailbox renamed onto a name created meanwhile).
	ErrConflict = errors.New("store: conflict")
	// ErrInvalid: the request itself is malformed (empty name, bad flag).
	ErrInvalid = errors.New("store: invalid argument")
	// ErrExpungesForgotten: Changes was asked for changes since a MODSEQ
	// below the mailbox's ExpungeFloor, so expunges after it may be
	// missing; the caller must compare message lists instead.
	ErrExpungesForgotten = errors.New("store: expunges forgotten")
	// ErrUnavailable: the store cannot take the write now (its disk is
	// full) and expects to later; the caller answers with a temporary
	// failure. Nothing of the refused write was kept.
	ErrUnavailable = errors.New("store: temporarily unavailable")
	// ErrOutcomeUnknown: the write may or may not have been applied, or
	// may still be applied later (a commit whose apply step, or whose
	// answer, was lost; docs/adr/0030). Callers must promise neither
	// success nor failure: a protocol closes the connection without a
	// reply, so that its client retries as after a lost connection. It
	// does not wrap ErrUnavailable, whose promise (nothing kept) it
	// cannot keep.
	ErrOutcomeUnknown = errors.New("store: outcome of the write unknown")
	// ErrInUse: another session, possibly in another process, holds the
	// lease asked for (MaildropLocker).
	ErrInUse = errors.New("store: in use")
	// ErrLeaseLost: a lease's holder can no longer be sure it holds it
	// (MaildropLease.Held).
	ErrLeaseLost = errors.New("store: lease lost")
)

// Health is whether an engine can write, as readiness and health checks
// report it.
type Health struct {
	// Writable: writes are accepted.
	Writable bool
	// Failed: the engine stopped writing for good; only reopening it (a
	// restart) recovers. Implies !Writable.
	Failed bool
	// Reason says why the engine is not writable; empty when it is.
	Reason string
}

// HealthReporter is implemented by engines that know their health.
type HealthReporter interface {
	Health() Health
}

// ID identifies mailboxes and blobs: 128 random bits, unique without
// coordination between nodes.
type ID [16]byte

// NewID returns a fresh random ID.
func NewID() ID {
	var id ID
	if _, err := rand.Read(id[:]); err != nil {
		panic("store: crypto/rand failed: " + err.Error())
	}
	return id
}

func (id ID) String() string { return hex.EncodeToString(id[:]) }

// IsZero reports whether id is the zero ID.
func (id ID) IsZero() bool { return id == ID{} }

// ParseID parses the String form of an ID.
func ParseID(s string) (ID, error) {
	var id ID
	b, err := hex.DecodeString(s)
	if err != nil || len(b) != len(id) {
		return id, ErrInvalid
	}
	copy(id[:], b)
	return id, nil
}

// UserStatus is an account's state.
type UserStatus uint8

const (
	UserActive   UserStatus = iota
	UserDisabled            // may not log in; mail to it is refused
)

// User is an account. Address is the normalized address and the key.
type User struct {
	Address      string
	PasswordHash string // PHC string (argon2id), never a plain password
	QuotaBytes   int64  // 0 means unlimited
	Status       UserStatus
	Created      time.Time
}

// Mailbox is a user's folder with its RFC 3501/9051 counters.
type Mailbox struct {
	ID            ID
	User          string
	Name          string // full hierarchical name, "/"-delimited; "INBOX" for the inbox
	SpecialUse    string // RFC 6154 attribute such as `\Sent`, or ""
	Subscribed    bool
	UIDValidity   uint32
	UIDNext       uint32
	HighestModSeq uint64
	Messages      uint32 // number of messages
	Size          int64  // octets of all messages
	// ExpungeFloor is the highest MODSEQ whose changes, expunges above
	// all, the change log may have forgotten: every change above it has
	// its entry. 0 means none is forgotten. It never decreases and never
	// exceeds HighestModSeq.
	ExpungeFloor uint64
}

// Standard IMAP system flags (RFC 3501 section 2.3.2). \Recent is session
// state and never stored.
const (
	FlagSeen     = `\Seen`
	FlagAnswered = `\Answered`
	FlagFlagged  = `\Flagged`
	FlagDeleted  = `\Deleted`
	FlagDraft    = `\Draft`
)

// Message is one message in a mailbox.
type Message struct {
	UID          uint32
	ModSeq       uint64
	Flags        []string // sorted, no duplicates
	InternalDate time.Time
	Size         int64
	Blob         ID
	// Meta is pre-computed metadata (envelope, body structure, selected
	// header fields) owned and encoded by the layer above; engines store it
	// opaquely so that metadata fetches never re-read the body.
	Meta []byte
}

// NewMessage is a message to append; the engine assigns UID and ModSeq.
// Its body is either a blob stored before (Blob) or given inline (Body);
// exactly one of the two is set.
type NewMessage struct {
	Blob ID
	// Body, given instead of Blob, is the whole message: Append stores it
	// as a new blob referenced by this message alone, written with the
	// append itself (one write instead of two for a message delivered to
	// one mailbox). Size must equal len(Body). Append does not keep Body.
	Body         []byte
	Size         int64
	Flags        []string
	InternalDate time.Time
	Meta         []byte
	// FreshBlob: Blob was stored by PutBlob for this message alone, just
	// before the Append, and nothing else holds it, so nothing can be
	// releasing it: an engine may skip its check for that (the Cassandra
	// batch mode's, blobs.go).
	FreshBlob bool
}

// Check reports, as ErrInvalid, a NewMessage that Append must refuse.
func (nm NewMessage) Check() error {
	switch {
	case nm.Size < 0:
		return fmt.Errorf("%w: negative message size", ErrInvalid)
	case nm.Body != nil && !nm.Blob.IsZero():
		return fmt.Errorf("%w: message with both a blob and an inline body", ErrInvalid)
	case nm.Body == nil && nm.Blob.IsZero():
		return fmt.Errorf("%w: message without body", ErrInvalid)
	case nm.Body != nil && int64(len(nm.Body)) != nm.Size:
		return fmt.Errorf("%w: inline body of %d octets with size %d", ErrInvalid, len(nm.Body), nm.Size)
	}
	return nil
}

// AppendOptions qualify an Append.
type AppendOptions struct {
	// CheckQuota makes Append fail with ErrOverQuota when the new messages
	// would take the user's usage over its quota.
	CheckQuota bool
	// UserQuota, if not nil, is the user's quota (User.QuotaBytes) as the
	// caller has just read it: CheckQuota uses it instead of reading the
	// user again.
	UserQuota *int64
	// Deferrable: the caller (a delivery, after its recipients' checks)
	// accepts that, when the user's manager cannot be reached in time, the
	// messages be recorded as pending deliveries, to be applied by the
	// manager later (PendingDeliveries, ADR 0034). Append then returns
	// them with UID 0. Only a cluster's routing store defers; every other
	// store appends as without it.
	Deferrable bool
}

// FlagOp is how SetFlags combines the given flags with a message's flags.
type FlagOp uint8

const (
	FlagsReplace FlagOp = iota
	FlagsAdd
	FlagsRemove
)

// FlagChange asks to change the flags of UIDs (RFC 3501 STORE, RFC 7162
// UNCHANGEDSINCE).
type FlagChange struct {
	UIDs  []uint32 // ascending
	Op    FlagOp
	Flags []string
	// UnchangedSince, when non-zero, leaves alone (and reports in
	// FlagResult.Failed) every message whose ModSeq is greater.
	UnchangedSince uint64
}

// FlagResult reports a SetFlags.
type FlagResult struct {
	Changed []Message // the messages whose flags changed, with their new ModSeq
	Failed  []uint32  // UIDs that failed the UnchangedSince test
}

// ChangeKind says what a change log entry records.
type ChangeKind uint8

const (
	ChangeAdded ChangeKind = iota + 1
	ChangeFlags
	ChangeExpunged
)

// Change is one change log entry: the UID whose state changed at ModSeq.
type Change struct {
	ModSeq uint64
	UID    uint32
	Kind   ChangeKind
}

// Usage is a user's quota usage over all mailboxes.
type Usage struct {
	Bytes    int64
	Messages int64
}

// MailboxOptions qualify CreateMailbox.
type MailboxOptions struct {
	SpecialUse string
	Subscribed bool
}

// Engine is the contract of a storage engine under the user manager
// (internal/usermgr, ADR 0023): the directory (users, aliases), mailboxes'
// records and names, blobs, reads of messages and change logs, quota
// usage, the POP3 maildrop lease and a consistency check. Mailbox writes
// that assign UIDs and MODSEQs are not here: the manager builds them and
// an engine applies them as batches (BatchWriter), or, until it does,
// orders them itself (Store). Every method is safe for concurrent use.
type Engine interface {
	// CreateUser creates u with an INBOX; ErrExists if the address is taken
	// by a user or an alias.
	CreateUser(ctx context.Context, u User) error
	GetUser(ctx context.Context, address string) (User, error)
	// UpdateUser replaces the mutable fields (PasswordHash, QuotaBytes,
	// Status) of an existing user.
	UpdateUser(ctx context.Context, u User) error
	// DeleteUser removes the user, its aliases, mailboxes and messages.
	DeleteUser(ctx context.Context, address string) error
	// ListUsers returns up to limit users with Address > after, ascending.
	ListUsers(ctx context.Context, after string, limit int) ([]User, error)

	// CreateAlias makes alias deliver to target, an existing user.
	CreateAlias(ctx context.Context, alias, target string) error
	DeleteAlias(ctx context.Context, alias string) error
	// ListAliases returns every alias and its target, ordered by alias.
	ListAliases(ctx context.Context) ([][2]string, error)
	// Resolve maps an address to the user it delivers to: a user's own
	// address, or an alias's target. ErrNotFound otherwise.
	Resolve(ctx context.Context, address string) (string, error)

	CreateMailbox(ctx context.Context, user, name string, opts MailboxOptions) (Mailbox, error)
	GetMailbox(ctx context.Context, user, name string) (Mailbox, error)
	// GetMailboxByID returns a mailbox's current state.
	GetMailboxByID(ctx context.Context, id ID) (Mailbox, error)
	ListMailboxes(ctx context.Context, user string) ([]Mailbox, error)
	// RenameMailbox renames a mailbox and its inferiors; the IDs and
	// contents stay (RFC 3501 section 6.3.5). Renaming INBOX is the layer
	// above's business: this call refuses it with ErrInvalid.
	RenameMailbox(ctx context.Context, user, from, to string) error
	// DeleteMailbox deletes a mailbox and its messages; INBOX cannot be
	// deleted (ErrInvalid).
	DeleteMailbox(ctx context.Context, user, name string) error
	SetSubscribed(ctx context.Context, user, name string, subscribed bool) error

	// PutBlob stores a body and returns its ID and size. It fails without
	// storing anything if r yields more than maxSize bytes or a read error
	// (returned wrapped). The blob is durable no later than the first
	// successful Append referencing it; a blob no message references is
	// reclaimed.
	PutBlob(ctx context.Context, r io.Reader, maxSize int64) (ID, int64, error)
	// OpenBlob returns a reader over a blob.
	OpenBlob(ctx context.Context, id ID) (BlobReader, error)

	// ListMessages returns up to limit messages with UID >= from, ascending.
	ListMessages(ctx context.Context, mailbox ID, from uint32, limit int) ([]Message, error)
	GetMessage(ctx context.Context, mailbox ID, uid uint32) (Message, error)
	// Changes returns change log entries with ModSeq > since, ascending
	// by (ModSeq, UID): up to limit of them, and more only to finish the
	// last MODSEQ it reaches, so that a caller paging by that entry's
	// ModSeq never skips the rest of a MODSEQ (one STORE or EXPUNGE can
	// change any number of messages at one MODSEQ). The log holds each
	// UID's latest change only, and an engine may forget the changes at
	// or below the mailbox's ExpungeFloor (RFC 7162 section 5 lets a
	// server forget expunges); a since below the floor fails with
	// ErrExpungesForgotten, never with a partial log.
	Changes(ctx context.Context, mailbox ID, since uint64, limit int) ([]Change, error)

	Usage(ctx context.Context, user string) (Usage, error)

	MaildropLocker

	// Check verifies the engine's internal consistency (counters agree with
	// contents, every reference resolves) and returns the problems found.
	Check(ctx context.Context) ([]string, error)
	Close() error
}

// Store is what the layers above the user manager use: an Engine plus the
// mailbox writes, ordered, with their UIDs and MODSEQs assigned. The user
// manager implements it over any engine; the Cassandra engine implements
// it on its own too (its writes order themselves with conditional
// updates), which the manager uses until that engine applies batches.
type Store interface {
	Engine

	// Append appends messages to a mailbox in order, assigning consecutive
	// UIDs and one new ModSeq, and returns them as stored. Each appended
	// message holds a reference to its blob.
	Append(ctx context.Context, mailbox ID, msgs []NewMessage, opts AppendOptions) ([]Message, error)
	SetFlags(ctx context.Context, mailbox ID, change FlagChange) (FlagResult, error)
	// Expunge removes the given UIDs (missing ones are ignored) and returns
	// the UIDs removed, ascending, and the ModSeq of the expunge.
	Expunge(ctx context.Context, mailbox ID, uids []uint32) ([]uint32, uint64, error)
}

// MaildropLocker grants the exclusive hold a POP3 session has on a user's
// maildrop (RFC 1939 section 8) among all sessions of all processes sharing
// the store.
type MaildropLocker interface {
	// LockMaildrop takes user's maildrop lease, or fails with ErrInUse
	// while another holder's lease is live. The lease lasts until Release,
	// or, in an engine shared by several processes, until its holder stops
	// renewing it (its process died) and its term runs out.
	LockMaildrop(ctx context.Context, user string) (MaildropLease, error)
}

// MaildropLease is one held maildrop lease. Its methods are safe for
// concurrent use.
type MaildropLease interface {
	// Held returns nil while the holder is sure to hold the lease, and an
	// error wrapping ErrLeaseLost once it may have expired or been taken
	// (renewals failed for its whole term): the holder must then not act
	// on its exclusivity (POP3 must not enter the UPDATE state).
	Held() error
	// Release gives the lease up (if still held) and stops its renewal. It
	// is safe to call more than once; an error leaves the lease to expire.
	Release(ctx context.Context) error
}

// MetaSetter is implemented by an engine that can record a message's Meta
// after the message was stored: delivery then stores none, and the first
// reader that needs the summary computes it from the body and keeps it
// (docs/adr/0011). Meta is derived data, so SetMeta changes no MODSEQ and
// nothing a client sees; it sets the Meta of each UID in metas that still
// exists and has none, and leaves the others as they are. It may be lost in
// a crash (the next reader computes it again) but is never half-written.
type MetaSetter interface {
	SetMeta(ctx context.Context, mailbox ID, metas map[uint32][]byte) error
}

// BlobReader reads a stored body. It is not safe for concurrent use.
type BlobReader interface {
	io.ReadSeekCloser
	io.ReaderAt
	Size() int64
}
