package imap

import (
	"context"
	"io"
	"net/netip"

	"quill/internal/mailbox"
)

// Backend authenticates users and gives each authenticated session its
// user's mailboxes. It is called concurrently from many sessions.
type Backend interface {
	// Authenticate checks a user name and password presented by the peer
	// at remote and returns the canonical user name.
	// Errors: auth.ErrInvalidCredentials, auth.ErrThrottled,
	// auth.ErrDisabled; anything else is a temporary failure.
	Authenticate(ctx context.Context, username, password string, remote netip.Addr) (user string, err error)
	// Mailboxes returns the mailboxes of an authenticated user.
	Mailboxes(ctx context.Context, user string) (Mailboxes, error)
}

// Mailboxes is one user's mailboxes, used by one session's goroutine.
// Errors are classified by the mailbox package's values (ErrNoSuchMailbox,
// ErrMailboxExists, ErrBadName, ErrOverQuota, ErrInvalid); anything else
// is a temporary failure.
type Mailboxes interface {
	List(ctx context.Context) ([]mailbox.Info, error)
	// Status returns a mailbox's counters and, if count, its flag counts
	// (which reads every message's flags).
	Status(ctx context.Context, name string, count bool) (mailbox.Info, mailbox.Counts, error)
	Create(ctx context.Context, name, specialUse string) error
	Delete(ctx context.Context, name string) error
	Rename(ctx context.Context, from, to string) error
	SetSubscribed(ctx context.Context, name string, on bool) error
	// PutBody prepares one APPEND literal of exactly size octets read
	// from r; with inline true, one of at most mailbox.InlineBodyMax octets
	// is held in memory and written with the Append.
	PutBody(ctx context.Context, r io.Reader, size int64, inline bool) (mailbox.Body, error)
	// Append appends messages atomically.
	Append(ctx context.Context, name string, msgs []mailbox.NewMessage) (mailbox.AppendResult, error)
	// Quota returns the user's storage quota and usage (RFC 9208).
	Quota(ctx context.Context) (mailbox.Quota, error)
	// Select opens a mailbox; the session closes the View.
	Select(ctx context.Context, name string, readOnly bool) (View, mailbox.SelectInfo, error)
}

// View is the selected mailbox: the session's sequence numbers and pending
// changes (see mailbox.View, which implements it, for the contract).
type View interface {
	ReadOnly() bool
	UIDValidity() uint32
	Len() uint32
	UID(seq uint32) uint32
	Seq(uid uint32) uint32
	UIDs() []uint32
	MaxUID() uint32
	Recent(uid uint32) bool
	Changed() <-chan struct{}
	Poll(ctx context.Context, allowExpunge bool) (mailbox.Updates, error)
	Messages(ctx context.Context, uids []uint32, fn func(mailbox.Message) error) error
	Open(ctx context.Context, m mailbox.Message) (mailbox.BodyReader, error)
	SetFlags(ctx context.Context, uids []uint32, op mailbox.FlagOp, flags []string) ([]mailbox.Message, error)
	SetFlagsIf(ctx context.Context, uids []uint32, op mailbox.FlagOp, flags []string, unchangedSince uint64) ([]mailbox.Message, []uint32, error)
	HighestModSeq() uint64
	ChangesSince(ctx context.Context, modseq uint64) (vanished []mailbox.UIDRange, changed []uint32, err error)
	Expunge(ctx context.Context, uids []uint32) error
	Copy(ctx context.Context, uids []uint32, dest string) (mailbox.CopyResult, error)
	// Move moves the messages atomically (RFC 6851), without the quota
	// check; the view learns of the expunges from its next Poll.
	Move(ctx context.Context, uids []uint32, dest string) (mailbox.CopyResult, error)
	// KeepsMeta reports whether KeepMeta stores anything; KeepMeta records
	// summaries computed for messages stored without one, by UID.
	KeepsMeta() bool
	KeepMeta(ctx context.Context, metas map[uint32][]byte) error
	Close()
}

var _ View = (*mailbox.View)(nil)
