package pop3

import (
	"context"
	"errors"
	"log/slog"

	"quill/internal/auth"
	"quill/internal/mailbox"
	"quill/internal/textconn"
)

// replyError is a protocol-level refusal whose text is sent to the client
// as is, after "-ERR ". Its text never contains client input.
type replyError struct {
	text string
	// fatal replies end the session after they are sent.
	fatal bool
	// silent: no response at all, and the session ends (implies fatal).
	silent bool
}

func (e *replyError) Error() string { return "pop3: " + e.text }

// errAbort is returned by a command handler when the connection cannot go
// on (a failed TLS handshake, a write error mid-response): no reply is sent
// and the session ends.
var errAbort = errors.New("pop3: session aborted")

// Refusals, each with its RFC 2449 section 8 / RFC 3206 response code where
// one applies.
var (
	errSyntax        = &replyError{text: "syntax error"}
	errUnknown       = &replyError{text: "unknown command"}
	errWrongState    = &replyError{text: "command not valid in this state"}
	errLineTooLong   = &replyError{text: "line too long"}
	errNoSuchMessage = &replyError{text: "no such message"}
	errDeleted       = &replyError{text: "message already deleted"}
	errUserFirst     = &replyError{text: "USER first"}
	errTLSRequired   = &replyError{text: "[AUTH] TLS required: use STLS first"}
	errNoPlaintext   = &replyError{text: "[AUTH] plaintext authentication disallowed on this connection"}
	errAlreadyTLS    = &replyError{text: "TLS already active"}
	errNoTLS         = &replyError{text: "STLS not available"}
	errMechanism     = &replyError{text: "unsupported authentication mechanism"}
	errAuthCancelled = &replyError{text: "authentication cancelled"}
	errAuthMalformed = &replyError{text: "[AUTH] malformed SASL response"}
	errAuthzid       = &replyError{text: "[AUTH] proxy authorization not supported"}
	errTooManyCmds   = &replyError{text: "too many commands without authentication, closing connection", fatal: true}
	errTimeout       = &replyError{text: "[SYS/TEMP] autologout: idle timeout", fatal: true}
	errShuttingDown  = &replyError{text: "[SYS/TEMP] server shutting down, try again later", fatal: true}
	errTemporary     = &replyError{text: "[SYS/TEMP] temporary failure, try again later"}
	errUpdateFailed  = &replyError{text: "[SYS/TEMP] some deleted messages not removed", fatal: true}
	// errUnanswered answers an UPDATE whose outcome is unknown
	// (mailbox.ErrOutcomeUnknown): -ERR would say that some deletions may
	// not have been made, +OK that all were; the connection closes with
	// neither, and the client, as after a lost connection, finds out in
	// its next session (docs/adr/0030).
	errUnanswered = &replyError{text: "outcome unknown", fatal: true, silent: true}
)

// errorReply is the one place that turns an error into the text of a -ERR
// response. Errors it does not know are temporary failures whose detail
// goes to the log only. counts reports whether the reply counts towards
// Server.MaxErrors: failures that are the server's fault do not.
func errorReply(log *slog.Logger, err error) (e *replyError, counts bool) {
	var re *replyError
	switch {
	case errors.Is(err, mailbox.ErrOutcomeUnknown):
		log.Warn("pop3: outcome of the update unknown, closing the connection without a reply", "err", err)
		return errUnanswered, false
	case errors.As(err, &re):
		return re, re != errTemporary
	case errors.Is(err, textconn.ErrLineTooLong):
		return errLineTooLong, true
	case errors.Is(err, auth.ErrInvalidCredentials):
		return &replyError{text: "[AUTH] invalid user name or password"}, true
	case errors.Is(err, auth.ErrThrottled):
		// RFC 2449 section 8.1.1: the client should not retry before a
		// delay, which is what a throttled login must do.
		return &replyError{text: "[LOGIN-DELAY] too many failed logins, try again later"}, true
	case errors.Is(err, auth.ErrBusy):
		// RFC 3206 section 4: SYS/TEMP, retrying later may succeed.
		return errTemporary, false
	case errors.Is(err, auth.ErrDisabled):
		// RFC 3206 section 4: SYS/PERM, retrying will not help.
		return &replyError{text: "[SYS/PERM] account disabled"}, true
	case errors.Is(err, mailbox.ErrInUse):
		// RFC 2449 section 8.1.2.
		return &replyError{text: "[IN-USE] maildrop is locked by another session"}, false
	case errors.Is(err, context.Canceled):
		return errShuttingDown, false
	}
	log.Error("pop3: temporary failure", "err", err)
	return errTemporary, false
}
