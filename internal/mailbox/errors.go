package mailbox

import (
	"errors"

	"quill/internal/store"
)

// ErrInUse is returned when a maildrop is already locked by another POP3
// session (RFC 2449 section 8.1.2, response code IN-USE).
var ErrInUse = errors.New("mailbox: maildrop in use")

// ErrOutcomeUnknown is store.ErrOutcomeUnknown, for the protocol front
// ends, which do not import the store: a write failed with it may or may
// not have been applied, so the client must be promised neither.
var ErrOutcomeUnknown = store.ErrOutcomeUnknown
