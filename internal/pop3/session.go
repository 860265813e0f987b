package pop3

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/netip"
	"os"

	"quill/internal/textconn"
)

// state is the RFC 1939 session state. UPDATE is not a state of its own
// here: it is the QUIT handler of TRANSACTION.
type state int

const (
	stateAuthorization state = iota
	stateTransaction
)

// session is one POP3 connection, driven by one goroutine.
//
// Invariants: in stateTransaction drop is non-nil, msgs is drop.Messages()
// and deleted has the same length; exactly one of drop.Commit (at QUIT) or
// drop.Close (any other end) is called, by end.
type session struct {
	cfg    *config
	conn   *textconn.Conn
	log    *slog.Logger
	remote netip.AddrPort

	state        state
	pendingUser  string // USER argument awaiting PASS
	errors       int    // replies counted against MaxErrors
	unauthCmds   int    // commands received in AUTHORIZATION
	user         string // authenticated user
	drop         Maildrop
	msgs         []Message
	deleted      []bool
	copyBuf      *[]byte // RETR/TOP copy buffer from copyBufs, taken on first use
	closeOnReply bool    // the command asked to end the session (QUIT)
	aborted      bool    // the connection is unusable; send nothing more
}

// serve runs the session until the client quits, the connection fails or
// the server shuts down. It does not close the connection.
func (s *session) serve(ctx context.Context) {
	defer s.end()
	if s.cfg.implicitTLS {
		if err := s.conn.StartTLS(s.cfg.tls); err != nil {
			s.log.Info("pop3: implicit TLS handshake failed", "err", err)
			return
		}
	}
	// RFC 1939 section 4: the greeting. No APOP, so no timestamp.
	s.writeLine("+OK " + s.cfg.hostname + " Quill POP3 server ready")
	for !s.closeOnReply {
		// RFC 2449 section 6.6, PIPELINING: flush only when the client
		// has no further command waiting.
		if !s.conn.HasLine() {
			if err := s.conn.Flush(); err != nil {
				s.log.Debug("pop3: write failed", "err", err)
				return
			}
		}
		line, err := s.conn.ReadLine()
		if err != nil {
			if !s.readFailed(err) {
				return
			}
			continue
		}
		cmd, err := ParseCommand(line)
		if err != nil {
			s.cfg.metrics.Command("unknown")
			s.fail("unknown", errSyntax)
			continue
		}
		s.dispatch(ctx, cmd)
	}
	if s.aborted {
		return
	}
	if err := s.conn.Flush(); err != nil {
		s.log.Debug("pop3: write failed", "err", err)
	}
}

// readFailed handles a ReadLine error and reports whether the session goes
// on.
func (s *session) readFailed(err error) bool {
	switch {
	case errors.Is(err, textconn.ErrLineTooLong):
		s.cfg.metrics.Command("unknown")
		s.fail("unknown", err)
		return !s.closeOnReply
	case errors.Is(err, textconn.ErrShutdown):
		s.fail("", errShuttingDown)
	case errors.Is(err, os.ErrDeadlineExceeded):
		// RFC 1939 section 3: autologout without entering UPDATE.
		s.fail("", errTimeout)
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
		s.log.Debug("pop3: client closed connection")
		return false
	default:
		s.log.Debug("pop3: read failed", "err", err)
		return false
	}
	_ = s.conn.Flush()
	return false
}

// dispatch runs one command. Each handler writes its own success response
// and returns an error for the single -ERR path.
func (s *session) dispatch(ctx context.Context, cmd Command) {
	h, ok := lookup(cmd.Name)
	name := cmd.Name
	if !ok {
		name = "unknown"
	}
	s.cfg.metrics.Command(name)
	if s.state == stateAuthorization {
		s.unauthCmds++
		if s.unauthCmds > s.cfg.maxUnauthCommands {
			s.fail(name, errTooManyCmds)
			return
		}
	}
	var err error
	switch {
	case !ok:
		err = errUnknown
	case h.states&(1<<s.state) == 0:
		err = errWrongState
	default:
		err = h.run(s, ctx, cmd)
	}
	if errors.Is(err, errAbort) {
		s.closeOnReply, s.aborted = true, true
		return
	}
	if err != nil {
		s.fail(name, err)
	}
}

// fail sends the -ERR response for err and applies the error budget. name
// is the metrics label ("" for none).
func (s *session) fail(name string, err error) {
	if name != "" {
		s.cfg.metrics.CommandError(name)
	}
	re, counts := errorReply(s.log, err)
	if re.silent {
		s.closeOnReply = true
		return
	}
	text := re.text
	if counts && !re.fatal {
		s.errors++
		if s.errors >= s.cfg.maxErrors {
			// One response per command: the refusal itself says that the
			// connection ends.
			text += " (too many errors, closing connection)"
			s.closeOnReply = true
		}
	}
	if re.fatal {
		s.closeOnReply = true
	}
	s.writeLine("-ERR " + text)
}

// writeLine buffers one response line. Write errors are sticky in the
// buffered writer and surface at the next Flush.
func (s *session) writeLine(line string) {
	_, _ = s.conn.WriteString(line + "\r\n")
}

func (s *session) writef(format string, args ...any) {
	_, _ = fmt.Fprintf(s.conn, format+"\r\n", args...)
}

// end releases the maildrop without changes if QUIT did not commit it.
func (s *session) end() {
	if s.drop == nil {
		return
	}
	if err := s.drop.Close(); err != nil {
		s.log.Warn("pop3: closing maildrop", "user", s.user, "err", err)
	}
	s.drop = nil
}

// authAllowed reports whether plaintext credentials may be sent on this
// connection (RFC 2595 section 2.1 and RFC 1939 section 13): under TLS,
// from a loopback peer, or when the operator allows it.
func (s *session) authAllowed() bool {
	return s.conn.TLS() != nil || s.cfg.allowInsecureAuth || s.remote.Addr().IsLoopback()
}

// handler is one command's implementation and the states it is valid in.
type handler struct {
	states int // bit set of 1<<state
	run    func(s *session, ctx context.Context, cmd Command) error
}

const (
	inAuthorization = 1 << stateAuthorization
	inTransaction   = 1 << stateTransaction
	inAny           = inAuthorization | inTransaction
)

// lookup returns the handler of a command keyword (upper case).
func lookup(name string) (handler, bool) {
	switch name {
	case "CAPA":
		return handler{inAny, (*session).cmdCapa}, true
	case "QUIT":
		return handler{inAny, (*session).cmdQuit}, true
	case "STLS":
		return handler{inAuthorization, (*session).cmdStls}, true
	case "USER":
		return handler{inAuthorization, (*session).cmdUser}, true
	case "PASS":
		return handler{inAuthorization, (*session).cmdPass}, true
	case "AUTH":
		return handler{inAuthorization, (*session).cmdAuth}, true
	case "NOOP":
		return handler{inTransaction, (*session).cmdNoop}, true
	case "STAT":
		return handler{inTransaction, (*session).cmdStat}, true
	case "LIST":
		return handler{inTransaction, (*session).cmdList}, true
	case "UIDL":
		return handler{inTransaction, (*session).cmdUidl}, true
	case "RETR":
		return handler{inTransaction, (*session).cmdRetr}, true
	case "TOP":
		return handler{inTransaction, (*session).cmdTop}, true
	case "DELE":
		return handler{inTransaction, (*session).cmdDele}, true
	case "RSET":
		return handler{inTransaction, (*session).cmdRset}, true
	}
	return handler{}, false
}
