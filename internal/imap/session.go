package imap

import (
	"bufio"
	"context"
	"errors"
	"io"
	"log/slog"
	"net/netip"
	"os"
	"strings"

	"quill/internal/mailbox"
	"quill/internal/textconn"
)

// state is the connection state of RFC 9051 section 3.
type state int

const (
	stateNotAuthenticated state = iota
	stateAuthenticated
	stateSelected
	stateLogout
)

// session is one IMAP connection, driven by one goroutine (IDLE adds a
// reader goroutine that it owns and joins).
//
// Invariants: mboxes is non-nil from stateAuthenticated on; view is
// non-nil exactly in stateSelected, and is closed when left.
type session struct {
	cfg      *config
	conn     *textconn.Conn
	log      *slog.Logger
	remote   netip.AddrPort
	shutdown <-chan struct{}
	enc      encoder

	state      state
	user       string
	mboxes     Mailboxes
	view       View
	errors     int // replies counted against MaxErrors
	unauthCmds int
	// commands is the per-connection command rate limit.
	commands commandBucket
	// saved is the SEARCHRES result (RFC 5182), as UIDs.
	saved []uint32
	// rev2 and qresync are enabled by ENABLE (RFC 5161); condstore by
	// ENABLE or by the first CONDSTORE-enabling command (RFC 7162 section
	// 3.1), and by qresync. None is ever disabled.
	rev2, condstore, qresync bool
	// compressed is set once COMPRESS=DEFLATE is active (RFC 4978).
	compressed bool
	// closing ends the session after the current response.
	closing bool
	// buf is scratch space for responses rendered by internal/mime.
	buf []byte
	// metas holds the summaries the current command computed for messages
	// of the selected mailbox stored without one, to be kept (keepMeta).
	metas map[uint32][]byte
}

// command is one decoded command line's tag and name.
type command struct {
	tag  string
	name string // upper case; "UID FETCH" etc. for UID commands
	uid  bool
}

// handlerFunc parses the rest of a command from d and runs it. It returns
// the text of the tagged OK (with a response code if any) or an error for
// the one failure path (respond).
type handlerFunc func(s *session, ctx context.Context, d *decoder, c *command) (string, error)

type handler struct {
	states int // bit set of 1<<state
	run    handlerFunc
	// noExpunge marks FETCH, STORE, SEARCH, SORT and THREAD by sequence
	// number, during which EXPUNGE may not be sent (RFC 3501 section
	// 7.4.1, RFC 5256 section 3).
	noExpunge bool
}

const (
	inNotAuth  = 1 << stateNotAuthenticated
	inAuth     = 1 << stateAuthenticated
	inSelected = 1 << stateSelected
	inAny      = inNotAuth | inAuth | inSelected
	inLoggedIn = inAuth | inSelected
)

// handlers maps command names to their implementations, one file each.
var handlers map[string]handler

func init() {
	handlers = map[string]handler{
		"CAPABILITY":   {states: inAny, run: (*session).cmdCapability},
		"NOOP":         {states: inAny, run: (*session).cmdNoop},
		"LOGOUT":       {states: inAny, run: (*session).cmdLogout},
		"ID":           {states: inAny, run: (*session).cmdID},
		"STARTTLS":     {states: inNotAuth, run: (*session).cmdStartTLS},
		"COMPRESS":     {states: inLoggedIn, run: (*session).cmdCompress},
		"LOGIN":        {states: inNotAuth, run: (*session).cmdLogin},
		"AUTHENTICATE": {states: inNotAuth, run: (*session).cmdAuthenticate},
		"ENABLE":       {states: inAuth, run: (*session).cmdEnable},
		"NAMESPACE":    {states: inLoggedIn, run: (*session).cmdNamespace},
		"CREATE":       {states: inLoggedIn, run: (*session).cmdCreate},
		"DELETE":       {states: inLoggedIn, run: (*session).cmdDelete},
		"RENAME":       {states: inLoggedIn, run: (*session).cmdRename},
		"SUBSCRIBE":    {states: inLoggedIn, run: (*session).cmdSubscribe},
		"UNSUBSCRIBE":  {states: inLoggedIn, run: (*session).cmdUnsubscribe},
		"LIST":         {states: inLoggedIn, run: (*session).cmdList},
		"LSUB":         {states: inLoggedIn, run: (*session).cmdLsub},
		"STATUS":       {states: inLoggedIn, run: (*session).cmdStatus},
		"APPEND":       {states: inLoggedIn, run: (*session).cmdAppend},
		"SELECT":       {states: inLoggedIn, run: (*session).cmdSelect},
		"EXAMINE":      {states: inLoggedIn, run: (*session).cmdExamine},
		"IDLE":         {states: inLoggedIn, run: (*session).cmdIdle},
		"GETQUOTA":     {states: inLoggedIn, run: (*session).cmdGetQuota},
		"GETQUOTAROOT": {states: inLoggedIn, run: (*session).cmdGetQuotaRoot},
		"SETQUOTA":     {states: inLoggedIn, run: (*session).cmdSetQuota},
		"CHECK":        {states: inSelected, run: (*session).cmdNoop},
		"CLOSE":        {states: inSelected, run: (*session).cmdClose},
		"UNSELECT":     {states: inSelected, run: (*session).cmdUnselect},
		"EXPUNGE":      {states: inSelected, run: (*session).cmdExpunge},
		"FETCH":        {states: inSelected, run: (*session).cmdFetch, noExpunge: true},
		"STORE":        {states: inSelected, run: (*session).cmdStore, noExpunge: true},
		"SEARCH":       {states: inSelected, run: (*session).cmdSearch, noExpunge: true},
		"COPY":         {states: inSelected, run: (*session).cmdCopy},
		"MOVE":         {states: inSelected, run: (*session).cmdMove},
		"UID FETCH":    {states: inSelected, run: (*session).cmdFetch},
		"UID STORE":    {states: inSelected, run: (*session).cmdStore},
		"UID SEARCH":   {states: inSelected, run: (*session).cmdSearch},
		"UID COPY":     {states: inSelected, run: (*session).cmdCopy},
		"UID MOVE":     {states: inSelected, run: (*session).cmdMove},
		"UID EXPUNGE":  {states: inSelected, run: (*session).cmdExpunge},
		"SORT":         {states: inSelected, run: (*session).cmdSort, noExpunge: true},
		"UID SORT":     {states: inSelected, run: (*session).cmdSort},
		"THREAD":       {states: inSelected, run: (*session).cmdThread, noExpunge: true},
		"UID THREAD":   {states: inSelected, run: (*session).cmdThread},
	}
}

// source implementation for the decoder.

func (s *session) ReadLine() ([]byte, error) { return s.conn.ReadLine() }
func (s *session) Reader() *bufio.Reader     { return s.conn.Reader() }
func (s *session) Continue(text string) error {
	s.enc.raw("+ ").raw(text).crlf()
	return s.conn.Flush()
}

// serve runs the session until LOGOUT, a fatal error or shutdown. It does
// not close the connection.
func (s *session) serve(ctx context.Context) {
	defer s.unselect()
	if s.cfg.implicitTLS {
		if err := s.conn.StartTLS(s.cfg.tls); err != nil {
			s.log.Info("imap: implicit TLS handshake failed", "err", err)
			return
		}
	}
	// RFC 9051 section 7.1.1: the greeting, with the capabilities so that
	// clients need not ask.
	s.enc.raw("* OK [CAPABILITY ").raw(s.capabilities()).raw("] ").raw(s.cfg.hostname).raw(" Quill IMAP server ready").crlf()
	for !s.closing {
		if !s.conn.HasLine() {
			if err := s.conn.Flush(); err != nil {
				s.log.Debug("imap: write failed", "err", err)
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
		s.command(ctx, line)
	}
	if err := s.conn.Flush(); err != nil {
		s.log.Debug("imap: write failed", "err", err)
	}
}

// readFailed handles a ReadLine error between commands and reports whether
// the session goes on.
func (s *session) readFailed(err error) bool {
	switch {
	case errors.Is(err, textconn.ErrLineTooLong):
		// The tag is lost with the line: an untagged BAD (RFC 9051
		// section 7.1.3).
		s.enc.raw("* BAD [TOOBIG] command line too long").crlf()
		return s.countError()
	case errors.Is(err, textconn.ErrShutdown):
		s.enc.raw("* BYE [UNAVAILABLE] server shutting down, try again later").crlf()
	case errors.Is(err, os.ErrDeadlineExceeded):
		s.enc.raw("* BYE autologout: idle for too long").crlf()
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
		s.log.Debug("imap: client closed connection")
		return false
	default:
		s.log.Debug("imap: read failed", "err", err)
		return false
	}
	_ = s.conn.Flush()
	return false
}

// countError counts a client-caused failure and reports whether the
// session may go on.
func (s *session) countError() bool {
	s.errors++
	if s.errors >= s.cfg.maxErrors {
		s.enc.raw("* BYE too many errors, closing connection").crlf()
		s.closing = true
		return false
	}
	return true
}

// command decodes and runs one command line.
func (s *session) command(ctx context.Context, line []byte) {
	d := newDecoder(s, line, s.cfg.maxLiteral, DefaultMaxLiterals)
	d.utf7 = !s.rev2
	tag, err := d.atom("]")
	if err != nil || strings.IndexByte(tag, '+') >= 0 {
		s.cfg.metrics.Command("unknown")
		s.finishBad(d, "*", syntaxErr("missing or invalid tag"))
		return
	}
	c := &command{tag: tag}
	if err := d.sp(); err != nil {
		s.finishBad(d, tag, syntaxErr("missing command"))
		return
	}
	name, err := d.atom("")
	if err != nil {
		s.finishBad(d, tag, syntaxErr("missing command"))
		return
	}
	c.name = strings.ToUpper(name)
	if c.name == "UID" {
		var sub string
		if err = d.sp(); err == nil {
			sub, err = d.atom("")
		}
		if err != nil {
			s.finishBad(d, tag, syntaxErr("missing UID command"))
			return
		}
		c.name, c.uid = "UID "+strings.ToUpper(sub), true
	}
	h, ok := handlers[c.name]
	label := c.name
	if !ok {
		label = "unknown"
	}
	s.cfg.metrics.Command(label)
	if s.state == stateNotAuthenticated {
		s.unauthCmds++
		if s.unauthCmds > s.cfg.maxUnauthCommands {
			_ = d.discard()
			s.enc.raw("* BYE too many commands without authentication").crlf()
			s.closing = true
			return
		}
	}
	if c.name != "LOGOUT" && !s.commands.take(s.cfg.now()) {
		// Not counted against MaxErrors: the connection survives a burst;
		// LOGOUT is always allowed, so a client can leave.
		s.cfg.metrics.CommandError(label)
		if derr := d.discard(); derr != nil {
			s.abort(derr)
			return
		}
		s.enc.raw(tag).raw(" NO [LIMIT] too many commands, slow down").crlf()
		return
	}
	switch {
	case !ok:
		s.cfg.metrics.CommandError(label)
		s.finishBad(d, tag, syntaxErr("unknown command"))
		return
	case h.states&(1<<s.state) == 0:
		s.cfg.metrics.CommandError(label)
		s.finishBad(d, tag, syntaxErr("command not valid in this state"))
		return
	}
	if !d.eol() && d.peek() != ' ' {
		s.finishBad(d, tag, syntaxErr("expected SP after command"))
		return
	}
	text, err := h.run(s, ctx, d, c)
	s.keepMeta(ctx)
	if err != nil {
		s.cfg.metrics.CommandError(label)
	}
	if d.pending > 0 || !d.eol() {
		if derr := d.discard(); derr != nil {
			s.abort(derr)
			return
		}
	}
	if err == errHandled {
		return
	}
	var ce errConnection
	if errors.As(err, &ce) || errors.Is(err, errResync) || errors.Is(err, errAbort) {
		s.abort(err)
		return
	}
	var pe *protoError
	isBad := errors.As(err, &pe) && !pe.no
	if !isBad && s.view != nil && s.state == stateSelected && !errors.Is(err, mailbox.ErrOutcomeUnknown) {
		s.poll(ctx, !h.noExpunge)
	}
	if err != nil {
		s.respond(tag, err)
		return
	}
	s.enc.raw(tag).raw(" OK ").raw(text).crlf()
}

// errAbort ends the session without a further response (a failed TLS
// handshake, a failure after part of a response was sent).
var errAbort = errors.New("imap: session aborted")

func (s *session) abort(err error) {
	switch {
	case errors.Is(err, errResync):
		s.enc.raw("* BYE [TOOBIG] literal too large").crlf()
		_ = s.conn.Flush()
	case errors.Is(err, textconn.ErrTooSlow):
		s.log.Info("imap: transfer too slow", "err", err)
		s.enc.raw("* BYE transfer too slow, closing connection").crlf()
		_ = s.conn.Flush()
	case errors.Is(err, os.ErrDeadlineExceeded):
		s.enc.raw("* BYE autologout: idle for too long").crlf()
		_ = s.conn.Flush()
	}
	s.log.Debug("imap: session ends", "err", err)
	s.closing = true
}

// finishBad drops the rest of a refused command and sends BAD.
func (s *session) finishBad(d *decoder, tag string, err error) {
	if derr := d.discard(); derr != nil {
		s.abort(derr)
		return
	}
	s.respond(tag, err)
}

// poll sends the untagged updates the selected mailbox owes the client.
func (s *session) poll(ctx context.Context, allowExpunge bool) {
	up, err := s.view.Poll(ctx, allowExpunge)
	if err != nil {
		s.log.Warn("imap: reading mailbox changes", "user", s.user, "err", err)
	}
	s.writeUpdates(up)
}

// unselect closes the selected mailbox, if any.
func (s *session) unselect() {
	if s.view != nil {
		s.view.Close()
		s.view = nil
	}
	if s.state == stateSelected {
		s.state = stateAuthenticated
	}
	s.saved = nil
}

// recent reports whether uid is \Recent in this session: never once
// IMAP4rev2 is enabled (RFC 9051 removed \Recent).
func (s *session) recent(uid uint32) bool { return !s.rev2 && s.view.Recent(uid) }

// authAllowed reports whether credentials may be sent in the clear here:
// under TLS, from loopback, or when the operator allows it (RFC 9051
// section 11.1).
func (s *session) authAllowed() bool {
	return s.conn.TLS() != nil || s.cfg.allowInsecureAuth || s.remote.Addr().IsLoopback()
}
