package smtp

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/base32"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"time"

	"quill/internal/delivery"
	"quill/internal/textconn"
)

// session is the state of one connection. It is owned by one goroutine.
type session struct {
	ctx  context.Context // cancelled when the server is closed
	srv  *Server
	lim  limits
	conn *textconn.Conn
	log  sessionLog
	id   string

	helo  string // "" until HELO/EHLO/LHLO
	esmtp bool   // EHLO or LHLO: extensions may be used
	user  string // authenticated user (submission)
	tx    *transaction

	errors      int    // failed commands (MaxErrors)
	commands    int    // commands before authentication (MaxCommandsBeforeAuth)
	lastCode    int    // code of the last reply written
	verb        string // of the command being run, for metrics
	pendingLine []byte // a command read while a BDAT body was expected
	closing     bool   // the session ends after the current reply
	replyBuf    []byte // writeReply's, reused; replyArr at first
	replyArr    [256]byte
}

// transaction is one mail transaction (RFC 5321 section 3.3), from MAIL to
// the end of its data or RSET.
type transaction struct {
	from  mailArgs
	rcpts []delivery.Recipient
}

func newSession(ctx context.Context, srv *Server, conn *textconn.Conn) *session {
	s := &session{
		ctx:  ctx,
		srv:  srv,
		lim:  srv.lim,
		conn: conn,
		id:   srv.newSessionID(),
	}
	s.replyBuf = s.replyArr[:0]
	s.log.l = srv.logger()
	s.log.attrs = append(s.log.arr[:0], slog.String("proto", srv.Mode.String()),
		slog.String("session", s.id), slog.String("remote", conn.RemoteAddr().String()))
	return s
}

// sessionLog is a session's logger: the server's, each record given the
// session's attributes (proto, session, remote; user once authenticated).
// A slog.Logger.With per connection formatted them into a new handler for
// every session, with one message per connection 1.2% of the server's CPU;
// here they are added to the records the session writes. The records
// carry no source position (no handler of quill serve prints one), which
// spares a runtime.Callers per record.
type sessionLog struct {
	l     *slog.Logger
	attrs []slog.Attr // arr at first
	arr   [4]slog.Attr
}

// with adds an attribute to every later record.
func (l *sessionLog) with(key, value string) { l.attrs = append(l.attrs, slog.String(key, value)) }

func (l *sessionLog) Debug(msg string, args ...any) { l.log(slog.LevelDebug, msg, args) }
func (l *sessionLog) Info(msg string, args ...any)  { l.log(slog.LevelInfo, msg, args) }
func (l *sessionLog) Warn(msg string, args ...any)  { l.log(slog.LevelWarn, msg, args) }
func (l *sessionLog) Error(msg string, args ...any) { l.log(slog.LevelError, msg, args) }

// log writes a record as slog.Logger.Log would, args being key-value
// pairs as it takes them.
func (l *sessionLog) log(level slog.Level, msg string, args []any) {
	ctx := context.Background()
	h := l.l.Handler()
	if !h.Enabled(ctx, level) {
		return
	}
	r := slog.NewRecord(time.Now(), level, msg, 0)
	r.AddAttrs(l.attrs...)
	r.Add(args...)
	_ = h.Handle(ctx, r)
}

// newID returns a random identifier for messages: 80 bits, base32 without
// padding (16 characters, safe in headers and logs).
func newID() string {
	var b [10]byte
	_, _ = rand.Read(b[:])
	return base32.StdEncoding.EncodeToString(b[:])
}

// newSessionID returns an identifier for a session's log records, unique
// among the server's sessions and, with high probability, across its
// restarts: a random prefix drawn once per Server and a count, 80 bits in
// the 16 characters of newID. It names log records only; the message IDs
// that reach headers stay random.
func (s *Server) newSessionID() string {
	n := s.sessions.Add(1)
	var b [10]byte
	binary.BigEndian.PutUint32(b[:4], s.idPrefix)
	binary.BigEndian.PutUint16(b[4:6], uint16(n>>32))
	binary.BigEndian.PutUint32(b[6:], uint32(n))
	var out [16]byte
	base32.StdEncoding.Encode(out[:], b[:])
	return string(out[:])
}

func (s *session) serve() {
	s.log.Debug("connection opened")
	defer s.log.Debug("connection closed")
	if s.srv.ImplicitTLS {
		if err := s.conn.StartTLS(s.srv.TLSConfig); err != nil {
			s.log.Info("implicit TLS handshake failed", "err", err)
			return
		}
	}
	greeting := "ESMTP"
	if s.srv.Mode == ModeLMTP {
		greeting = "LMTP"
	}
	s.writeReply(reply{220, "", s.srv.Hostname + " " + greeting + " Quill ready"})
	for !s.closing {
		line, err := s.nextLine()
		if err != nil {
			s.readFailed(err)
			break
		}
		s.command(line)
	}
	_ = s.conn.Flush()
}

// nextLine returns the next command line, flushing replies first unless
// more pipelined commands are already buffered (RFC 2920 section 3.2).
func (s *session) nextLine() (string, error) {
	if s.pendingLine != nil {
		l := string(s.pendingLine)
		s.pendingLine = nil
		return l, nil
	}
	if !s.conn.HasLine() {
		if err := s.conn.Flush(); err != nil {
			return "", err
		}
	}
	for {
		line, err := s.conn.ReadLine()
		if errors.Is(err, textconn.ErrLineTooLong) {
			s.writeReply(reply{500, "5.5.2", "Line too long"})
			if s.countError() {
				return "", errTooManyErrors
			}
			if !s.conn.HasLine() {
				if err := s.conn.Flush(); err != nil {
					return "", err
				}
			}
			continue
		}
		return string(line), err
	}
}

var errTooManyErrors = errors.New("smtp: too many errors")

// readFailed says goodbye where the connection still works.
func (s *session) readFailed(err error) {
	switch {
	case errors.Is(err, errTooManyErrors):
		// Already answered.
	case errors.Is(err, textconn.ErrShutdown):
		s.writeReply(reply{421, "4.3.2", s.srv.Hostname + " Service shutting down"})
	case errors.Is(err, os.ErrDeadlineExceeded):
		s.log.Info("idle timeout")
		s.writeReply(reply{421, "4.4.2", s.srv.Hostname + " Timeout, closing connection"})
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
		s.log.Debug("client closed connection")
	default:
		s.log.Info("connection failed", "err", err)
	}
}

// writeReply buffers r; sessions flush in nextLine or before blocking.
func (s *session) writeReply(r reply) {
	s.lastCode = r.code
	// Appended, not formatted: fmt boxed every argument, a few
	// allocations per reply.
	b := strconv.AppendInt(s.replyBuf[:0], int64(r.code), 10)
	b = append(b, ' ')
	if r.enh != "" {
		b = append(append(b, r.enh...), ' ')
	}
	b = append(append(b, r.text...), "\r\n"...)
	s.replyBuf = b
	_, _ = s.conn.Write(b)
}

// writeError answers err through replyFor, logging what the client is not
// told.
func (s *session) writeError(err error, what string) {
	r, known := replyFor(err)
	if r.none() {
		s.closeUnanswered(err)
		return
	}
	if !known {
		s.log.Warn(what+" failed", "err", err)
	}
	s.writeReply(r)
}

// closeUnanswered ends the session without a reply to the end of a
// message whose delivery outcome is unknown (noReply): the replies
// already written still go out, then the connection closes. It counts as
// the command's error.
func (s *session) closeUnanswered(err error) {
	s.log.Warn("outcome of the delivery unknown, closing the connection without a reply", "err", err)
	s.srv.Metrics.CommandError(metricName(s.verb))
	s.closing = true
}

// countError counts a failed command and, over the limit, ends the session
// with 421 (RFC 5321 section 4.3.2 lets a server close after 421).
func (s *session) countError() (closed bool) {
	s.errors++
	if s.errors < s.lim.maxErrors {
		return false
	}
	s.log.Info("too many errors")
	s.writeReply(reply{421, "4.7.0", s.srv.Hostname + " Too many errors, closing connection"})
	s.closing = true
	return true
}

// command runs one command line.
func (s *session) command(line string) {
	cmd, err := parseCommand(line)
	verb := cmd.verb
	if err == nil && verb != "AUTH" && len(line) > s.lim.maxLine {
		err = errReply(500, "5.5.2", "Line too long")
	}
	if s.srv.Mode == ModeSubmission && s.user == "" {
		s.commands++
		if s.commands > s.lim.maxBeforeAuth {
			s.log.Info("too many commands before authentication")
			s.writeReply(reply{421, "4.7.0", s.srv.Hostname + " Too many commands before authentication"})
			s.closing = true
			return
		}
	}
	s.srv.Metrics.Command(metricName(verb))
	s.verb = verb
	if err == nil {
		err = s.dispatch(cmd)
	}
	if err != nil {
		s.writeError(err, verb)
	}
	if s.lastCode >= 400 && !s.closing {
		s.srv.Metrics.CommandError(metricName(verb))
		// A refused body is not a client error, and neither is the
		// recipient limit: RFC 5321 section 4.5.3.1.10 expects the client
		// to send the rest in another transaction, so counting it would
		// close the session before a message to many recipients is sent.
		if verb != "DATA" && verb != "BDAT" && err != errTooManyRecipients {
			s.countError()
		}
	}
}

// dispatch runs a parsed command. It returns an error to be answered by
// replyFor, or nil after writing its own replies.
func (s *session) dispatch(cmd command) error {
	lmtp := s.srv.Mode == ModeLMTP
	switch cmd.verb {
	case "EHLO", "HELO":
		if lmtp {
			return errReply(500, "5.5.1", "This is LMTP: use LHLO")
		}
		return s.hello(cmd)
	case "LHLO":
		if !lmtp {
			return errReply(500, "5.5.1", "Command not recognized")
		}
		return s.hello(cmd)
	case "MAIL":
		return s.mail(cmd.arg)
	case "RCPT":
		return s.rcpt(cmd.arg)
	case "DATA":
		return s.data(cmd.arg)
	case "BDAT":
		return s.bdat(cmd.arg)
	case "RSET":
		if cmd.arg != "" {
			return errReply(501, "5.5.4", "RSET takes no arguments")
		}
		s.tx = nil
		s.writeReply(reply{250, "2.0.0", "Flushed"})
	case "NOOP":
		s.writeReply(reply{250, "2.0.0", "OK"})
	case "QUIT":
		s.writeReply(reply{221, "2.0.0", s.srv.Hostname + " Bye"})
		s.closing = true
	case "VRFY":
		if cmd.arg == "" {
			return errReply(501, "5.5.4", "Syntax: VRFY <address>")
		}
		// RFC 5321 section 3.5.3: neither confirm nor deny.
		s.writeReply(reply{252, "2.5.0", "Cannot VRFY user, but will accept message and attempt delivery"})
	case "EXPN":
		s.writeReply(reply{502, "5.5.1", "EXPN not supported"})
	case "HELP":
		s.writeReply(reply{214, "2.0.0", "See RFC 5321 (https://www.rfc-editor.org/rfc/rfc5321)"})
	case "STARTTLS":
		return s.startTLS(cmd.arg)
	case "AUTH":
		return s.auth(cmd.arg)
	case "":
		return errReply(500, "5.5.2", "Empty command")
	default:
		return errReply(500, "5.5.1", "Command not recognized")
	}
	return nil
}

func (s *session) hello(cmd command) error {
	if !validHelo(cmd.arg) {
		return errReply(501, "5.5.4", "Syntax: "+cmd.verb+" domain")
	}
	s.tx = nil
	s.helo = cmd.arg
	s.esmtp = cmd.verb != "HELO"
	s.setCommandTimeout()
	if !s.esmtp {
		s.writeReply(reply{250, "", s.srv.Hostname})
		return nil
	}
	// The reply is appended in one buffer: the greeting line, the
	// Server's keywords (ehloKeywords), then those that depend on the
	// session; the last line's separator becomes a space (RFC 5321
	// section 4.2.1).
	b := append(s.replyBuf[:0], "250-"...)
	b = append(append(append(b, s.srv.Hostname...), " greets "...), cmd.arg...)
	last := 3 // the separator of the last line so far
	for _, kw := range s.srv.ehloKeywords {
		last = len(b) + 5
		b = append(append(b, "\r\n250-"...), kw...)
	}
	if s.srv.TLSConfig != nil && s.conn.TLS() == nil {
		last = len(b) + 5
		b = append(b, "\r\n250-STARTTLS"...)
	}
	if s.authOffered() && s.user == "" {
		last = len(b) + 5
		b = append(b, "\r\n250-AUTH PLAIN LOGIN"...)
	}
	b[last] = ' '
	b = append(b, "\r\n"...)
	s.replyBuf = b
	_, _ = s.conn.Write(b)
	s.lastCode = 250
	return nil
}

func (s *session) startTLS(arg string) error {
	switch {
	case s.srv.TLSConfig == nil:
		return errReply(502, "5.5.1", "STARTTLS not supported")
	case s.conn.TLS() != nil:
		return errReply(503, "5.5.1", "TLS already active")
	case arg != "":
		return errReply(501, "5.5.4", "STARTTLS takes no arguments")
	}
	s.writeReply(reply{220, "2.0.0", "Ready to start TLS"})
	if err := s.conn.Flush(); err != nil {
		s.closing = true
		return nil
	}
	if err := s.conn.StartTLS(s.srv.TLSConfig); err != nil {
		s.log.Info("STARTTLS handshake failed", "err", err)
		s.closing = true
		return nil
	}
	// RFC 3207 section 4.2: forget everything learnt before TLS.
	s.helo, s.esmtp, s.user, s.tx = "", false, "", nil
	s.setCommandTimeout()
	return nil
}

// setCommandTimeout applies the command timeout of the session's phase:
// PreauthTimeout until the client has identified itself (MX, LMTP) or
// authenticated (submission), RFC 5321 section 4.5.3.2.7's ReadTimeout
// afterwards.
func (s *session) setCommandTimeout() {
	pre := s.helo == ""
	if s.srv.Mode == ModeSubmission {
		pre = s.user == ""
	}
	if pre {
		s.conn.SetReadTimeout(s.lim.preauthTimeout)
	} else {
		s.conn.SetReadTimeout(s.lim.readTimeout)
	}
}

// authOffered reports whether AUTH may be used now (RFC 8314 section 3.3 /
// RFC 4954 section 4: not over plaintext unless allowed).
func (s *session) authOffered() bool {
	if s.srv.Mode != ModeSubmission {
		return false
	}
	return s.conn.TLS() != nil || s.srv.AllowInsecureAuth || s.conn.RemoteAddr().Addr().IsLoopback()
}

func (s *session) mail(arg string) error {
	switch {
	case s.helo == "":
		return errReply(503, "5.5.1", "Say "+s.helloVerb()+" first")
	case s.tx != nil:
		return errReply(503, "5.5.1", "Nested MAIL command")
	case s.srv.Mode == ModeSubmission && s.user == "":
		return errReply(530, "5.7.0", "Authentication required")
	}
	m, err := parseMail(arg, s.esmtp)
	if err != nil {
		return err
	}
	if m.size > s.lim.maxMessage {
		return errReply(552, "5.3.4", "Message size exceeds fixed maximum message size")
	}
	if s.user != "" {
		if err := s.srv.Backend.CheckSender(s.ctx, s.user, m.from); err != nil {
			return err
		}
	}
	s.tx = &transaction{from: m}
	s.writeReply(reply{250, "2.1.0", "Sender OK"})
	return nil
}

func (s *session) helloVerb() string {
	if s.srv.Mode == ModeLMTP {
		return "LHLO"
	}
	return "EHLO"
}

func (s *session) rcpt(arg string) error {
	if s.tx == nil {
		return errReply(503, "5.5.1", "Need MAIL before RCPT")
	}
	addr, err := parseRcpt(arg, s.tx.from.smtpUTF8)
	if err != nil {
		return err
	}
	if len(s.tx.rcpts) >= s.lim.maxRecipients {
		return errTooManyRecipients
	}
	if addr.Domain == "" {
		// RFC 5321 section 4.5.1: "postmaster" without a domain is this
		// host's postmaster.
		addr.Domain = s.srv.Hostname
	}
	rcpt, err := s.srv.Backend.Resolve(s.ctx, addr, delivery.ResolveOptions{
		Authenticated: s.user != "",
		Size:          s.tx.from.size,
	})
	if err != nil {
		return err
	}
	if s.srv.Mode != ModeLMTP {
		// One copy per mailbox, however many of its addresses were named.
		// LMTP keeps duplicates: each RCPT gets its own reply after DATA.
		for _, r := range s.tx.rcpts {
			if r.User == rcpt.User {
				s.writeReply(reply{250, "2.1.5", "Recipient OK"})
				return nil
			}
		}
	}
	s.tx.rcpts = append(s.tx.rcpts, rcpt)
	s.writeReply(reply{250, "2.1.5", "Recipient OK"})
	return nil
}

// dataReady checks the transaction before DATA or BDAT.
func (s *session) dataReady() error {
	switch {
	case s.tx == nil:
		return errReply(503, "5.5.1", "Need MAIL first")
	case len(s.tx.rcpts) == 0:
		return errReply(554, "5.5.1", "No valid recipients")
	}
	return nil
}

func (s *session) data(arg string) error {
	if arg != "" {
		return errReply(501, "5.5.4", "DATA takes no arguments")
	}
	if err := s.dataReady(); err != nil {
		return err
	}
	s.writeReply(reply{354, "", "Start mail input; end with <CRLF>.<CRLF>"})
	if err := s.conn.Flush(); err != nil {
		s.closing = true
		return nil
	}
	prev := s.conn.ReadTimeout()
	s.conn.SetReadTimeout(s.lim.dataTimeout)
	defer s.conn.SetReadTimeout(prev)
	s.conn.BeginTransfer(s.lim.minRate, s.lim.transferGrace)
	defer s.conn.EndTransfer()

	body := newDataReader(s.conn.Reader(), s.lim.maxMessage, s.lim.maxDataLine)
	results, err := s.deliver(body, func() bool { return body.eofSeen })
	if derr := body.drain(); derr != nil {
		s.bodyFailed("DATA", derr)
		return nil
	}
	s.finish(results, err)
	return nil
}

// bodyFailed ends the session after the connection failed while a body
// was read: nothing was delivered, and the client, if it is still there
// (a timeout, a transfer below the minimum rate), is told why
// (RFC 5321 section 4.5.3.2: 421 and close).
func (s *session) bodyFailed(verb string, err error) {
	s.closing = true
	switch {
	case errors.Is(err, textconn.ErrTooSlow):
		s.log.Info("transfer too slow during "+verb, "err", err)
		s.writeReply(reply{421, "4.4.2", s.srv.Hostname + " Transfer too slow, closing connection"})
	case errors.Is(err, os.ErrDeadlineExceeded):
		s.log.Info("timeout during "+verb, "err", err)
		s.writeReply(reply{421, "4.4.2", s.srv.Hostname + " Timeout, closing connection"})
	default:
		s.log.Info("connection failed during "+verb, "err", err)
	}
}

// deliver hands the message to the Backend: trace fields (RFC 5321 section
// 4.4) followed by the body as it streams in. complete reports whether the
// body was read to its end.
func (s *session) deliver(body io.Reader, complete func() bool) ([]error, error) {
	tx := s.tx
	id := newID()
	now := s.srv.now()
	from := tx.from.from.String()
	header := s.traceFields(tx, from, id, now)
	results, err := s.srv.Backend.Deliver(s.ctx, delivery.Message{
		ReturnPath: tx.from.from,
		Recipients: tx.rcpts,
		Body:       io.MultiReader(bytes.NewReader(header), body),
		ReceivedAt: now,
	})
	if err == nil && !complete() {
		// Acknowledging would claim a truncated message durable.
		err = errors.New("smtp: backend returned before reading the whole body")
	}
	if err == nil && len(results) != len(tx.rcpts) {
		err = fmt.Errorf("smtp: backend returned %d results for %d recipients", len(results), len(tx.rcpts))
	}
	s.log.Info("message", "id", id, "from", from, "rcpts", len(tx.rcpts), "err", err)
	return results, err
}

// finish answers the end of a message and ends the transaction. LMTP gets
// one reply per recipient in RCPT order (RFC 2033 section 4.2); SMTP one
// for all. A delivery of unknown outcome gets none (noReply): SMTP closes
// the connection without answering, LMTP after the replies of the
// recipients before the first unknown one.
func (s *session) finish(results []error, err error) {
	defer func() { s.tx = nil }()
	if s.closing {
		return
	}
	var rcptErr func(i int) error
	if err != nil {
		if r, known := replyFor(err); !known {
			s.log.Warn("delivery failed", "err", err)
			err = errReply(r.code, r.enh, r.text)
		}
		rcptErr = func(int) error { return err }
	} else {
		rcptErr = func(i int) error { return results[i] }
	}
	if s.srv.Mode == ModeLMTP {
		for i, rc := range s.tx.rcpts {
			if e := rcptErr(i); e != nil {
				r, _ := replyFor(e)
				if r.none() {
					// Replies are matched to recipients by position, so
					// the ones before this recipient's go out and the
					// rest, known or not, are left to the retry.
					s.closeUnanswered(e)
					return
				}
				s.writeReply(reply{r.code, r.enh, "<" + rc.Address.String() + "> " + r.text})
			} else {
				s.writeReply(reply{250, "2.0.0", "<" + rc.Address.String() + "> Delivered"})
			}
		}
		return
	}
	if err != nil {
		s.writeError(err, "delivery")
		return
	}
	// SMTP has one reply for all recipients. Any success is durable, so
	// it must be acknowledged unless a temporary failure makes a retry
	// worth a duplicate (RFC 5321 section 6.1 prefers duplicates to loss).
	var temp, perm []error
	var refused []string
	for i, e := range results {
		if e == nil {
			continue
		}
		r, known := replyFor(e)
		if r.none() {
			// One reply for all: none can be given.
			s.closeUnanswered(e)
			return
		}
		if !known {
			s.log.Warn("delivery to recipient failed", "rcpt", s.tx.rcpts[i].User, "err", e)
		}
		if r.temporary() {
			temp = append(temp, e)
		} else {
			perm = append(perm, e)
		}
		refused = append(refused, s.tx.rcpts[i].User)
	}
	switch {
	case len(temp) > 0:
		s.writeError(temp[0], "delivery")
	case len(perm) == len(results):
		s.writeError(perm[0], "delivery")
	default:
		if len(perm) > 0 {
			// TODO(outbound): send a DSN for these recipients once Quill
			// has an outbound queue; until then they are only logged.
			s.log.Error("recipients refused after DATA; no bounce sent", "refused", refused)
		}
		s.writeReply(reply{250, "2.0.0", "OK: message accepted"})
	}
}

// traceFields returns the Return-Path and Received fields that begin the
// stored message (RFC 5321 section 4.4; protocol names from RFC 3848 and
// RFC 6531 section 3.7.3). from is the reverse-path as a string. It builds
// them by appending to one buffer: with fmt they were a tenth of the bytes
// the server allocated per delivered message.
func (s *session) traceFields(tx *transaction, from, id string, now time.Time) []byte {
	b := make([]byte, 0, 192+len(from)+len(s.helo)+len(s.srv.Hostname))
	b = append(b, "Return-Path: <"...)
	b = append(b, from...)
	b = append(b, ">\r\n"...)
	proto := "SMTP"
	if s.srv.Mode == ModeLMTP {
		proto = "LMTP"
	}
	if s.esmtp && s.srv.Mode != ModeLMTP {
		proto = "ESMTP"
	}
	if tx.from.smtpUTF8 {
		proto = "UTF8" + strings.TrimPrefix(proto, "E")
	}
	if s.conn.TLS() != nil && proto != "SMTP" {
		proto += "S"
	}
	if s.user != "" && proto != "SMTP" {
		proto += "A"
	}
	b = append(b, "Received: from "...)
	b = append(b, s.helo...)
	b = append(b, " ("...)
	b = appendAddressLiteral(b, s.conn.RemoteAddr().Addr())
	b = append(b, ")\r\n\tby "...)
	b = append(b, s.srv.Hostname...)
	b = append(b, " (Quill) with "...)
	b = append(b, proto...)
	b = append(b, " id "...)
	b = append(b, id...)
	if len(tx.rcpts) == 1 {
		b = append(b, "\r\n\tfor <"...)
		b = append(b, tx.rcpts[0].Address.String()...)
		b = append(b, '>')
	}
	b = append(b, ";\r\n\t"...)
	b = now.AppendFormat(b, "Mon, 02 Jan 2006 15:04:05 -0700")
	return append(b, "\r\n"...)
}

// appendAddressLiteral appends ip as an RFC 5321 section 4.1.3 address
// literal.
func appendAddressLiteral(b []byte, ip netip.Addr) []byte {
	if ip.Is6() {
		b = append(b, "[IPv6:"...)
	} else {
		b = append(b, '[')
	}
	return append(ip.AppendTo(b), ']')
}
