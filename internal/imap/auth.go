package imap

import (
	"context"
	"encoding/base64"
	"strings"

	"quill/internal/auth"
)

// cmdStartTLS: RFC 9051 section 6.2.1. The OK is flushed before the
// handshake; textconn drops plaintext pipelined after the command.
func (s *session) cmdStartTLS(ctx context.Context, d *decoder, c *command) (string, error) {
	if err := d.end(); err != nil {
		return "", err
	}
	if s.cfg.tls == nil || s.conn.TLS() != nil {
		return "", syntaxErr("STARTTLS not available")
	}
	s.enc.raw(c.tag).raw(" OK begin TLS negotiation now").crlf()
	if err := s.conn.Flush(); err != nil {
		return "", errAbort
	}
	if err := s.conn.StartTLS(s.cfg.tls); err != nil {
		s.log.Info("imap: STARTTLS handshake failed", "err", err)
		return "", errAbort
	}
	return "", errHandled
}

// errHandled says the handler has sent its tagged response itself.
var errHandled = &protoError{text: "handled"}

// loginRefusal is the answer to credentials on a connection that may not
// carry them (RFC 9051 section 6.2.3, LOGINDISABLED).
func (s *session) loginRefusal() error {
	if s.cfg.tls != nil {
		return &protoError{no: true, code: "PRIVACYREQUIRED", text: "use STARTTLS first"}
	}
	return &protoError{no: true, code: "PRIVACYREQUIRED", text: "plaintext authentication disallowed"}
}

// cmdLogin: RFC 9051 section 6.2.3.
func (s *session) cmdLogin(ctx context.Context, d *decoder, c *command) (string, error) {
	var user, pass string
	err := d.sp()
	if err == nil {
		user, err = d.astring()
	}
	if err == nil {
		err = d.sp()
	}
	if err == nil {
		pass, err = d.astring()
	}
	if err == nil {
		err = d.end()
	}
	if err != nil {
		return "", err
	}
	if !s.authAllowed() {
		return "", s.loginRefusal()
	}
	return s.login(ctx, user, pass)
}

// cmdAuthenticate: RFC 9051 section 6.2.2 with SASL-IR (RFC 4959); only
// PLAIN (RFC 4616).
func (s *session) cmdAuthenticate(ctx context.Context, d *decoder, c *command) (string, error) {
	if err := d.sp(); err != nil {
		return "", err
	}
	mech, err := d.atom("")
	if err != nil {
		return "", err
	}
	var ir string
	hasIR := false
	if !d.eol() {
		if err := d.sp(); err != nil {
			return "", err
		}
		if ir, err = d.atom("="); err != nil {
			return "", err
		}
		hasIR = true
	}
	if err := d.end(); err != nil {
		return "", err
	}
	if !strings.EqualFold(mech, "PLAIN") {
		return "", &protoError{no: true, code: "CANNOT", text: "unsupported authentication mechanism"}
	}
	if !s.authAllowed() {
		return "", s.loginRefusal()
	}
	if !hasIR {
		if err := s.Continue(""); err != nil {
			return "", errConnection{err}
		}
		line, err := s.conn.ReadLine()
		if err != nil {
			return "", errConnection{err}
		}
		ir = string(line)
	}
	if ir == "*" {
		return "", syntaxErr("authentication cancelled")
	}
	if ir == "=" {
		ir = ""
	}
	msg, err := base64.StdEncoding.DecodeString(ir)
	if err != nil {
		return "", syntaxErr("malformed SASL response")
	}
	authz, user, pass, err := auth.ParsePlain(msg)
	if err != nil {
		return "", syntaxErr("malformed SASL response")
	}
	if authz != "" && authz != user {
		return "", &protoError{no: true, code: "AUTHORIZATIONFAILED", text: "proxy authorization not supported"}
	}
	return s.login(ctx, user, pass)
}

// login completes LOGIN or AUTHENTICATE.
func (s *session) login(ctx context.Context, username, password string) (string, error) {
	user, err := s.cfg.backend.Authenticate(ctx, username, password, s.remote.Addr())
	if err != nil {
		return "", err
	}
	mboxes, err := s.cfg.backend.Mailboxes(ctx, user)
	if err != nil {
		return "", err
	}
	s.user, s.mboxes, s.state = user, mboxes, stateAuthenticated
	s.conn.SetReadTimeout(s.cfg.readTimeout)
	s.log.Info("imap: login", "user", user)
	return "[CAPABILITY " + s.capabilities() + "] logged in", nil
}
