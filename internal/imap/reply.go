package imap

import (
	"context"
	"errors"

	"quill/internal/auth"
	"quill/internal/mailbox"
)

// replyFor is the one place that turns an error into a tagged response:
// BAD or NO, a response code (RFC 5530) and a text that never carries
// internal detail. Errors it does not know are temporary failures, logged
// here. counts reports whether the reply counts towards MaxErrors.
//
// A write whose outcome is unknown (mailbox.ErrOutcomeUnknown) gets no
// tagged response at all: a NO would promise that nothing happened, an OK
// that it did. The session sends BYE (RFC 9051 section 7.1.5) and closes,
// so that the client, as after a lost connection, reconnects and finds out
// (docs/adr/0030).
func (s *session) replyFor(err error) (pe *protoError, counts bool) {
	switch {
	case errors.Is(err, mailbox.ErrOutcomeUnknown):
		s.log.Warn("imap: outcome of a write unknown, closing the connection without a reply", "user", s.user, "err", err)
		return &protoError{no: true, bye: true, code: "UNAVAILABLE", text: "outcome of the last command unknown, check and retry"}, false
	case errors.As(err, &pe):
		return pe, true
	case errors.Is(err, auth.ErrInvalidCredentials):
		return &protoError{no: true, code: "AUTHENTICATIONFAILED", text: "invalid user name or password"}, true
	case errors.Is(err, auth.ErrThrottled):
		return &protoError{no: true, code: "UNAVAILABLE", text: "too many failed logins, try again later"}, true
	case errors.Is(err, auth.ErrDisabled):
		return &protoError{no: true, code: "AUTHORIZATIONFAILED", text: "account disabled"}, true
	case errors.Is(err, auth.ErrBusy):
		return &protoError{no: true, code: "UNAVAILABLE", text: "too many logins in progress, try again later"}, false
	case errors.Is(err, mailbox.ErrNoSuchMailbox):
		return &protoError{no: true, code: "NONEXISTENT", text: "no such mailbox"}, false
	case errors.Is(err, mailbox.ErrMailboxExists):
		return &protoError{no: true, code: "ALREADYEXISTS", text: "mailbox already exists"}, false
	case errors.Is(err, mailbox.ErrBadName):
		return &protoError{no: true, code: "CANNOT", text: "invalid mailbox name"}, false
	case errors.Is(err, mailbox.ErrOverQuota):
		return &protoError{no: true, code: "OVERQUOTA", text: "quota exceeded"}, false
	case errors.Is(err, mailbox.ErrTooBig):
		return &protoError{no: true, code: "TOOBIG", text: "message too large"}, false
	case errors.Is(err, mailbox.ErrInvalid):
		return &protoError{text: "invalid argument"}, true
	case errors.Is(err, mailbox.ErrExpunged):
		return &protoError{no: true, code: "EXPUNGEISSUED", text: "some messages were expunged"}, false
	case errors.Is(err, mailbox.ErrReadOnly):
		return &protoError{no: true, code: "CANNOT", text: "mailbox is read-only"}, false
	case errors.Is(err, context.Canceled):
		return &protoError{no: true, code: "UNAVAILABLE", text: "server shutting down"}, false
	}
	s.log.Error("imap: temporary failure", "user", s.user, "err", err)
	return &protoError{no: true, code: "UNAVAILABLE", text: "temporary failure, try again later"}, false
}

// respond sends the tagged (or untagged, tag "*") failure for err and
// applies the error budget; or, for a write of unknown outcome, BYE
// instead, ending the session.
func (s *session) respond(tag string, err error) {
	pe, counts := s.replyFor(err)
	if pe.bye {
		s.enc.raw("* BYE [").raw(pe.code).raw("] ").raw(pe.text).crlf()
		s.closing = true
		return
	}
	s.enc.raw(tag)
	if pe.no {
		s.enc.raw(" NO ")
	} else {
		s.enc.raw(" BAD ")
	}
	if pe.code != "" {
		s.enc.raw("[").raw(pe.code).raw("] ")
	}
	s.enc.raw(pe.text).crlf()
	if counts {
		s.countError()
	}
}
