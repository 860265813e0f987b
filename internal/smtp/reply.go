package smtp

import (
	"context"
	"errors"
	"fmt"

	"quill/internal/auth"
	"quill/internal/delivery"
)

// reply is one SMTP reply (RFC 5321 section 4.2) with its enhanced status
// code (RFC 3463, RFC 2034); enh is empty only where RFC 2034 section 3
// omits it (the greeting, EHLO and intermediate 3xx replies).
type reply struct {
	code int
	enh  string
	text string
}

// replyError is a protocol error that carries the reply it is answered
// with; parsers and state checks return it.
type replyError reply

func (e *replyError) Error() string { return fmt.Sprintf("smtp: %d %s %s", e.code, e.enh, e.text) }

func errReply(code int, enh, text string) error { return &replyError{code, enh, text} }

// Errors of the message body, detected while Deliver reads it.
var (
	// errMessageTooBig: the body exceeds MaxMessageBytes (RFC 1870
	// section 6.3 says 552 after the data has been received).
	errMessageTooBig = errors.New("smtp: message exceeds size limit")
	// errDataLineTooLong: a text line of the body exceeds
	// MaxDataLineLength (RFC 5321 section 4.5.3.1.6).
	errDataLineTooLong = errors.New("smtp: message line too long")
	// errBDATAborted: a command other than BDAT arrived before BDAT LAST,
	// ending the chunked transaction (RFC 3030 section 3).
	errBDATAborted = errors.New("smtp: BDAT transaction interrupted by another command")
)

// errTooManyRecipients answers a RCPT over MaxRecipients (RFC 5321 section
// 4.5.3.1.10); it is not counted toward MaxErrors.
var errTooManyRecipients = errReply(452, "4.5.3", "Too many recipients")

var genericTempFailure = reply{451, "4.3.0", "Temporary failure, please try again later"}

// noReply is what replyFor gives a delivery whose outcome is unknown
// (delivery.ErrOutcomeUnknown): no reply at all, and the connection
// closes. RFC 5321 section 3.8 has the client treat a connection lost
// after the data as a temporary failure and send the message again: a
// duplicate, which section 6.1 prefers to a loss, where a 451 would
// promise that nothing was stored and a 250 that it was (docs/adr/0030).
var noReply = reply{}

// none reports whether r is noReply.
func (r reply) none() bool { return r.code == 0 }

// replyFor is the one place that turns an error into what the client sees.
// known is false for unclassified errors: they become a generic temporary
// failure and the caller logs the detail, which never reaches the client.
func replyFor(err error) (r reply, known bool) {
	var re *replyError
	switch {
	case errors.Is(err, delivery.ErrOutcomeUnknown):
		return noReply, true
	case errors.As(err, &re):
		return reply(*re), true
	case errors.Is(err, delivery.ErrRelayDenied):
		return reply{550, "5.7.1", "Relay access denied"}, true
	case errors.Is(err, delivery.ErrOutboundDisabled):
		return reply{550, "5.7.1", "Outbound delivery not enabled"}, true
	case errors.Is(err, delivery.ErrNoSuchUser):
		return reply{550, "5.1.1", "No such user here"}, true
	case errors.Is(err, delivery.ErrOverQuota):
		return reply{552, "5.2.2", "Mailbox quota exceeded"}, true
	case errors.Is(err, delivery.ErrMailboxFull):
		return reply{452, "4.2.2", "Mailbox full, try again later"}, true
	case errors.Is(err, delivery.ErrDisabled):
		return reply{550, "5.2.1", "Mailbox disabled"}, true
	case errors.Is(err, delivery.ErrSenderNotAllowed):
		return reply{553, "5.7.1", "Sender address not owned by authenticated user"}, true
	case errors.Is(err, auth.ErrInvalidCredentials), errors.Is(err, auth.ErrDisabled):
		// A disabled account answers like a bad password: the reply must
		// not reveal which accounts exist.
		return reply{535, "5.7.8", "Authentication credentials invalid"}, true
	case errors.Is(err, auth.ErrThrottled):
		return reply{454, "4.7.0", "Too many authentication failures, try again later"}, true
	case errors.Is(err, auth.ErrBusy):
		// RFC 4954 section 6: temporary authentication failure.
		return reply{454, "4.7.0", "Temporary authentication failure, try again later"}, true
	case errors.Is(err, auth.ErrMalformed):
		return reply{501, "5.5.2", "Malformed authentication response"}, true
	case errors.Is(err, errMessageTooBig):
		return reply{552, "5.3.4", "Message size exceeds fixed maximum message size"}, true
	case errors.Is(err, errDataLineTooLong):
		return reply{500, "5.5.2", "Message line too long"}, true
	case errors.Is(err, errBDATAborted):
		return reply{503, "5.5.1", "BDAT transaction aborted"}, true
	case errors.Is(err, delivery.ErrBusy):
		return reply{451, "4.3.1", "Insufficient system resources, try again later"}, true
	case errors.Is(err, context.Canceled):
		return reply{421, "4.3.2", "Service shutting down"}, true
	}
	return genericTempFailure, false
}

// temporary reports whether a reply asks the client to retry.
func (r reply) temporary() bool { return r.code >= 400 && r.code < 500 }
