package mailbox

import "errors"

// ErrInUse is returned when a maildrop is already locked by another POP3
// session (RFC 2449 section 8.1.2, response code IN-USE).
var ErrInUse = errors.New("mailbox: maildrop in use")
