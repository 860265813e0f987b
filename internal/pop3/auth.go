package pop3

import (
	"bytes"
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"strings"

	"quill/internal/auth"
	"quill/internal/textconn"
)

// cmdCapa lists capabilities (RFC 2449 section 5). What is listed depends
// on the state and the connection: USER and SASL only while credentials
// may be sent, STLS only while it can be used.
func (s *session) cmdCapa(ctx context.Context, cmd Command) error {
	if len(cmd.Args) != 0 {
		return errSyntax
	}
	caps := []string{"TOP", "UIDL"}
	if s.state == stateAuthorization && s.authAllowed() {
		caps = append(caps, "USER", "SASL PLAIN LOGIN")
	}
	caps = append(caps, "RESP-CODES", "AUTH-RESP-CODE", "PIPELINING")
	if s.state == stateAuthorization && s.cfg.tls != nil && s.conn.TLS() == nil {
		caps = append(caps, "STLS")
	}
	// Quill never deletes messages on its own (RFC 2449 section 6.7).
	caps = append(caps, "EXPIRE NEVER", "IMPLEMENTATION Quill")
	s.writeLine("+OK capability list follows")
	for _, c := range caps {
		s.writeLine(c)
	}
	s.writeLine(".")
	return nil
}

// cmdStls upgrades to TLS (RFC 2595 section 4). The response is flushed
// before the handshake; plaintext pipelined after STLS is discarded by
// StartTLS, and what the client said before is forgotten.
func (s *session) cmdStls(ctx context.Context, cmd Command) error {
	switch {
	case len(cmd.Args) != 0:
		return errSyntax
	case s.conn.TLS() != nil:
		return errAlreadyTLS
	case s.cfg.tls == nil:
		return errNoTLS
	}
	s.writeLine("+OK begin TLS negotiation")
	if err := s.conn.Flush(); err != nil {
		return errAbort
	}
	if err := s.conn.StartTLS(s.cfg.tls); err != nil {
		s.log.Info("pop3: STLS handshake failed", "err", err)
		return errAbort
	}
	s.pendingUser = ""
	return nil
}

// cmdUser records the user name for PASS (RFC 1939 section 7). It always
// succeeds so that user names cannot be probed.
func (s *session) cmdUser(ctx context.Context, cmd Command) error {
	if !s.authAllowed() {
		return s.plaintextRefusal()
	}
	if len(cmd.Args) != 1 {
		return errSyntax
	}
	s.pendingUser = cmd.Args[0]
	s.writeLine("+OK send PASS")
	return nil
}

// cmdPass completes USER/PASS (RFC 1939 section 7). The whole rest of the
// line is the password, spaces included; a failed PASS forgets the USER.
func (s *session) cmdPass(ctx context.Context, cmd Command) error {
	if !s.authAllowed() {
		return s.plaintextRefusal()
	}
	if s.pendingUser == "" {
		return errUserFirst
	}
	if cmd.Rest == "" {
		return errSyntax
	}
	user := s.pendingUser
	s.pendingUser = ""
	return s.login(ctx, user, cmd.Rest)
}

// cmdAuth runs a SASL exchange (RFC 5034 section 4). Mechanisms: PLAIN
// (RFC 4616) and LOGIN (draft-murchison-sasl-login). AUTH without a
// mechanism lists them, as many clients expect.
func (s *session) cmdAuth(ctx context.Context, cmd Command) error {
	if !s.authAllowed() {
		return s.plaintextRefusal()
	}
	if len(cmd.Args) == 0 {
		s.writeLine("+OK SASL mechanisms follow")
		s.writeLine("PLAIN")
		s.writeLine("LOGIN")
		s.writeLine(".")
		return nil
	}
	if len(cmd.Args) > 2 {
		return errSyntax
	}
	var initial []byte
	hasInitial := len(cmd.Args) == 2
	if hasInitial {
		var err error
		if initial, err = decodeSASL(cmd.Args[1]); err != nil {
			return err
		}
	}
	switch strings.ToUpper(cmd.Args[0]) {
	case "PLAIN":
		msg := initial
		if !hasInitial {
			var err error
			if msg, err = s.saslChallenge(""); err != nil {
				return err
			}
		}
		authzid, authcid, passwd, err := auth.ParsePlain(msg)
		if err != nil {
			return errAuthMalformed
		}
		if authzid != "" && authzid != authcid {
			return errAuthzid
		}
		return s.login(ctx, authcid, passwd)
	case "LOGIN":
		user := initial
		if !hasInitial {
			var err error
			if user, err = s.saslChallenge("Username:"); err != nil {
				return err
			}
		}
		passwd, err := s.saslChallenge("Password:")
		if err != nil {
			return err
		}
		if len(user) == 0 || bytes.ContainsAny(user, "\x00") || bytes.ContainsAny(passwd, "\x00") {
			return errAuthMalformed
		}
		return s.login(ctx, string(user), string(passwd))
	}
	return errMechanism
}

// saslChallenge sends one server challenge and reads the client's response
// line (RFC 5034 section 4): "*" cancels, anything else is base64.
func (s *session) saslChallenge(challenge string) ([]byte, error) {
	s.writeLine("+ " + base64.StdEncoding.EncodeToString([]byte(challenge)))
	if err := s.conn.Flush(); err != nil {
		return nil, fmt.Errorf("pop3: sending SASL challenge: %w", err)
	}
	line, err := s.conn.ReadLine()
	if err != nil {
		if errors.Is(err, textconn.ErrLineTooLong) {
			return nil, err
		}
		s.readFailed(err)
		return nil, errAbort
	}
	if string(line) == "*" {
		return nil, errAuthCancelled
	}
	return decodeSASL(string(line))
}

// decodeSASL decodes a base64 SASL response; "=" is the empty response
// (RFC 5034 section 4).
func decodeSASL(arg string) ([]byte, error) {
	if arg == "=" {
		return []byte{}, nil
	}
	b, err := base64.StdEncoding.DecodeString(arg)
	if err != nil {
		return nil, errAuthMalformed
	}
	return b, nil
}

// plaintextRefusal is the reply to credentials offered where they may not
// be sent: STLS first if the server has TLS.
func (s *session) plaintextRefusal() error {
	if s.cfg.tls != nil {
		return errTLSRequired
	}
	return errNoPlaintext
}

// login authenticates and opens the maildrop, entering TRANSACTION
// (RFC 1939 section 4). A maildrop that cannot be locked leaves the session
// in AUTHORIZATION.
func (s *session) login(ctx context.Context, username, password string) error {
	user, err := s.cfg.backend.Authenticate(ctx, username, password, s.remote.Addr())
	if err != nil {
		s.log.Info("pop3: authentication failed", "username", username, "err", err)
		return fmt.Errorf("pop3: authenticate: %w", err)
	}
	drop, err := s.cfg.backend.OpenMaildrop(ctx, user)
	if err != nil {
		s.log.Info("pop3: opening maildrop failed", "user", user, "err", err)
		return fmt.Errorf("pop3: open maildrop of %s: %w", user, err)
	}
	s.user, s.drop, s.state = user, drop, stateTransaction
	s.conn.SetReadTimeout(s.cfg.readTimeout)
	s.msgs = drop.Messages()
	s.deleted = make([]bool, len(s.msgs))
	s.log = s.log.With("user", user)
	n, size := s.stat()
	s.log.Info("pop3: logged in", "messages", n, "octets", size)
	s.writef("+OK maildrop has %d messages (%d octets)", n, size)
	return nil
}
