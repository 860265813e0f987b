package smtp

import (
	"encoding/base64"
	"strings"

	"quill/internal/auth"
)

// auth runs AUTH (RFC 4954) with the PLAIN (RFC 4616) and LOGIN
// mechanisms. Credentials are never logged.
func (s *session) auth(arg string) error {
	switch {
	case s.srv.Mode != ModeSubmission:
		return errReply(502, "5.5.1", "AUTH not supported")
	case !s.authOffered():
		return errReply(538, "5.7.11", "Encryption required for requested authentication mechanism")
	case s.helo == "":
		return errReply(503, "5.5.1", "Say EHLO first")
	case s.user != "":
		return errReply(503, "5.5.1", "Already authenticated")
	case s.tx != nil:
		return errReply(503, "5.5.1", "AUTH not allowed during a mail transaction")
	}
	mech, initial, hasInitial := strings.Cut(arg, " ")
	var username, password string
	switch strings.ToUpper(mech) {
	case "PLAIN":
		msg, err := s.saslResponse("", initial, hasInitial)
		if err != nil {
			return err
		}
		authzid, authcid, passwd, err := auth.ParsePlain(msg)
		if err != nil {
			return err
		}
		if authzid != "" && authzid != authcid {
			// Quill supports no proxy authorization (RFC 4616 section 2).
			return auth.ErrInvalidCredentials
		}
		username, password = authcid, passwd
	case "LOGIN":
		u, err := s.saslResponse("VXNlcm5hbWU6", initial, hasInitial) // "Username:"
		if err != nil {
			return err
		}
		p, err := s.saslResponse("UGFzc3dvcmQ6", "", false) // "Password:"
		if err != nil {
			return err
		}
		username, password = string(u), string(p)
	default:
		return errReply(504, "5.5.4", "Unrecognized authentication mechanism")
	}
	user, err := s.srv.Backend.Authenticate(s.ctx, username, password, s.conn.RemoteAddr().Addr())
	if err != nil {
		s.log.Info("authentication failed", "username", username, "err", err)
		return err
	}
	s.user = user
	s.setCommandTimeout()
	s.log.with("user", user)
	s.log.Info("authenticated")
	s.writeReply(reply{235, "2.7.0", "Authentication successful"})
	return nil
}

var errAuthCancelled = errReply(501, "5.0.0", "Authentication cancelled")

// saslResponse returns the decoded client response: the initial response
// when given ("=" is an empty one, RFC 4954 section 4), otherwise one read
// after a 334 challenge.
func (s *session) saslResponse(challenge, initial string, hasInitial bool) ([]byte, error) {
	line := initial
	if !hasInitial {
		s.writeReply(reply{334, "", challenge})
		if err := s.conn.Flush(); err != nil {
			return nil, err
		}
		l, err := s.conn.ReadLine()
		if err != nil {
			return nil, errReply(501, "5.5.2", "Cannot read authentication response")
		}
		line = string(l)
	}
	switch line {
	case "*":
		return nil, errAuthCancelled
	case "=":
		return []byte{}, nil
	}
	b, err := base64.StdEncoding.DecodeString(line)
	if err != nil {
		return nil, errReply(501, "5.5.2", "Cannot decode authentication response")
	}
	return b, nil
}
