package imap

import (
	"context"
	"strconv"
	"strings"
)

// capabilities lists what this connection may use now (RFC 9051 section
// 7.2.2). Everything listed is implemented; docs/adr/0008-imap.md keeps the
// list and what remains.
func (s *session) capabilities() string {
	var b strings.Builder
	b.WriteString("IMAP4rev1 IMAP4rev2 LITERAL+ SASL-IR ID ENABLE IDLE NAMESPACE UNSELECT UIDPLUS MOVE CHILDREN" +
		" SPECIAL-USE CREATE-SPECIAL-USE MULTIAPPEND STATUS=SIZE ESEARCH SEARCHRES CONDSTORE QRESYNC LIST-EXTENDED LIST-STATUS BINARY QUOTA QUOTA=RES-STORAGE SORT SORT=DISPLAY THREAD=ORDEREDSUBJECT THREAD=REFERENCES COMPRESS=DEFLATE APPENDLIMIT=")
	b.WriteString(strconv.FormatInt(s.cfg.appendLimit, 10))
	if s.state == stateNotAuthenticated {
		if s.cfg.tls != nil && s.conn.TLS() == nil {
			b.WriteString(" STARTTLS")
		}
		if s.authAllowed() {
			b.WriteString(" AUTH=PLAIN")
		} else {
			b.WriteString(" LOGINDISABLED")
		}
	}
	return b.String()
}

// cmdCapability: RFC 9051 section 6.1.1.
func (s *session) cmdCapability(ctx context.Context, d *decoder, c *command) (string, error) {
	if err := d.end(); err != nil {
		return "", err
	}
	s.enc.raw("* CAPABILITY ").raw(s.capabilities()).crlf()
	return "CAPABILITY completed", nil
}

// cmdNoop: RFC 9051 section 6.1.2 (and CHECK, RFC 3501 section 6.4.1):
// the updates are sent by the dispatcher's poll.
func (s *session) cmdNoop(ctx context.Context, d *decoder, c *command) (string, error) {
	if err := d.end(); err != nil {
		return "", err
	}
	return c.name + " completed", nil
}

// cmdLogout: RFC 9051 section 6.1.3.
func (s *session) cmdLogout(ctx context.Context, d *decoder, c *command) (string, error) {
	if err := d.end(); err != nil {
		return "", err
	}
	s.unselect()
	s.state = stateLogout
	s.enc.raw("* BYE logging out").crlf()
	s.closing = true
	return "LOGOUT completed", nil
}

// cmdID: RFC 2971. The client's parameters are read and ignored; the
// server names itself.
func (s *session) cmdID(ctx context.Context, d *decoder, c *command) (string, error) {
	if err := d.sp(); err != nil {
		return "", err
	}
	if d.peek() == '(' {
		n := 0
		err := d.list(func() error {
			n++
			if n > 60 { // 30 pairs, RFC 2971 section 3.3
				return &protoError{code: "LIMIT", text: "too many ID parameters"}
			}
			_, _, err := d.nstring()
			return err
		})
		if err != nil {
			return "", err
		}
		if n%2 != 0 {
			return "", syntaxErr("ID parameters must be pairs")
		}
	} else if _, ok, err := d.nstring(); err != nil || ok {
		return "", syntaxErr("expected parameter list or NIL")
	}
	if err := d.end(); err != nil {
		return "", err
	}
	s.enc.raw(`* ID ("name" "Quill")`).crlf()
	return "ID completed", nil
}

// cmdEnable: RFC 5161 (and RFC 9051 section 6.3.1). IMAP4rev2, CONDSTORE
// and QRESYNC (which implies CONDSTORE, RFC 7162 section 3.2.3) can be
// enabled; other names are ignored. ENABLED lists only what this command
// newly enabled.
func (s *session) cmdEnable(ctx context.Context, d *decoder, c *command) (string, error) {
	var names []string
	for !d.eol() {
		if err := d.sp(); err != nil {
			return "", err
		}
		a, err := d.atom("")
		if err != nil {
			return "", err
		}
		names = append(names, strings.ToUpper(a))
	}
	if len(names) == 0 {
		return "", syntaxErr("ENABLE needs a capability")
	}
	e := s.enc.raw("* ENABLED")
	for _, n := range names {
		switch {
		case n == "IMAP4REV2" && !s.rev2:
			s.rev2 = true
			e.raw(" IMAP4rev2")
		case n == "CONDSTORE" && !s.condstore:
			s.condstore = true
			e.raw(" CONDSTORE")
		case n == "QRESYNC" && !s.qresync:
			s.qresync, s.condstore = true, true
			e.raw(" QRESYNC")
		}
	}
	e.crlf()
	return "ENABLE completed", nil
}

// cmdNamespace: RFC 2342. One personal namespace, no others.
func (s *session) cmdNamespace(ctx context.Context, d *decoder, c *command) (string, error) {
	if err := d.end(); err != nil {
		return "", err
	}
	s.enc.raw(`* NAMESPACE (("" "/")) NIL NIL`).crlf()
	return "NAMESPACE completed", nil
}
