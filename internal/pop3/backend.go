package pop3

import (
	"context"
	"io"
	"net/netip"
)

// Backend authenticates users and opens their maildrops. It is called
// concurrently from many sessions.
type Backend interface {
	// Authenticate checks a username and password presented by the peer at
	// remote and returns the canonical user name.
	// Errors: auth.ErrInvalidCredentials, auth.ErrThrottled, auth.ErrDisabled;
	// anything else = temporary.
	Authenticate(ctx context.Context, username, password string, remote netip.Addr) (user string, err error)
	// OpenMaildrop locks the user's INBOX for this session; mailbox.ErrInUse
	// if another session holds it.
	OpenMaildrop(ctx context.Context, user string) (Maildrop, error)
}

// Maildrop is one session's locked view of the INBOX, fixed at open
// (RFC 1939 section 5: message numbers do not change during a session).
// A session calls its methods from one goroutine, and calls exactly one of
// Commit or Close, last.
type Maildrop interface {
	// Messages lists the maildrop; index i is message number i+1. The
	// result must not change during the session.
	Messages() []Message
	// Retrieve opens the full stored message i (0-based), with CRLF line
	// endings. The caller closes it.
	Retrieve(ctx context.Context, i int) (io.ReadCloser, error)
	// Commit is the UPDATE state (RFC 1939 section 6): it expunges the
	// messages with these 0-based indexes atomically, then unlocks. The
	// maildrop is unlocked even when Commit fails.
	Commit(ctx context.Context, deleted []int) error
	// Close unlocks without changes (connection lost, no QUIT).
	Close() error
}

// Message describes one message of a Maildrop.
type Message struct {
	// UID is the unique-id listed by UIDL (RFC 1939 section 7): stable
	// across sessions, 1 to 70 characters in the range 0x21 to 0x7E.
	UID string
	// Size is the exact size in octets of the message as Retrieve returns
	// it (RFC 1939 section 5, LIST and STAT).
	Size int64
}
