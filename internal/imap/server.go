package imap

import (
	"context"
	"crypto/tls"
	"errors"
	"log/slog"
	"net"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"quill/internal/textconn"
)

// Defaults for the limits of a Server, applied in one place (config).
const (
	// DefaultMaxLineLength bounds one line of a command, CRLF excluded
	// (literals are bounded separately). RFC 7162 section 4 asks clients
	// to keep lines below 8192 octets and servers to accept at least that.
	DefaultMaxLineLength = 64 << 10
	// DefaultAppendLimit bounds one APPEND message (RFC 7889 APPENDLIMIT).
	DefaultAppendLimit = 50 << 20
	// DefaultMaxErrors is the number of BAD/NO replies caused by the
	// client after which the connection is closed.
	DefaultMaxErrors = 50
	// DefaultMaxUnauthCommands bounds the commands before login.
	DefaultMaxUnauthCommands = 20
	// DefaultReadTimeout is the autologout timer of an idle client: at
	// least 30 minutes (RFC 9051 section 5.4), IDLE included.
	DefaultReadTimeout = 30 * time.Minute
	// DefaultUnauthTimeout is the shorter timer before login.
	DefaultUnauthTimeout = time.Minute
	// DefaultWriteTimeout bounds each network write.
	DefaultWriteTimeout = time.Minute
	// DefaultHandshakeTimeout bounds a TLS handshake.
	DefaultHandshakeTimeout = 30 * time.Second
	// DefaultMinTransferRate and DefaultTransferGrace bound how slowly an
	// APPEND's literals may arrive (textconn.Conn.BeginTransfer): 1 KiB/s
	// after 30 s, as for SMTP bodies.
	DefaultMinTransferRate = 1 << 10
	DefaultTransferGrace   = 30 * time.Second
	// DefaultCommandRate is the sustained commands per second of one
	// connection: far above what a client needs (mbsync and offlineimap
	// pipeline a few dozen commands per second at most), low enough that
	// one connection cannot monopolise a core with cheap commands.
	DefaultCommandRate = 200
	// DefaultCommandBurst is the commands one connection may send at once
	// above the rate (a client's pipelined batch).
	DefaultCommandBurst = 400
)

// ErrServerClosed is returned by Serve after Shutdown or Close.
var ErrServerClosed = textconn.ErrServerClosed

// Server is an IMAP server. Set the fields before the first Serve; zero
// limits take the Default values above. Serve may be called for several
// listeners (e.g. 143 and, on another Server with ImplicitTLS, 993).
type Server struct {
	// Name labels the listener in logs and metrics; default "imap".
	Name string
	// Hostname is announced in the greeting; default os.Hostname().
	Hostname string
	// TLSConfig enables STARTTLS (RFC 9051 section 6.2.1), or implicit TLS
	// with ImplicitTLS (RFC 8314); nil means no TLS.
	TLSConfig   *tls.Config
	ImplicitTLS bool
	// AllowInsecureAuth allows LOGIN and AUTHENTICATE without TLS from any
	// peer; loopback peers are always allowed. Otherwise the server
	// advertises LOGINDISABLED (RFC 9051 section 6.2.3).
	AllowInsecureAuth bool
	// Backend is required.
	Backend Backend
	// Logger receives the log; nil means slog.Default(). Credentials are
	// never logged.
	Logger *slog.Logger
	// Metrics and Limiter are shared with other listeners; both may be nil.
	Metrics *textconn.Metrics
	Limiter *textconn.Limiter

	MaxLineLength     int   // octets per command line, CRLF excluded
	MaxLiteral        int64 // octets per literal outside APPEND
	AppendLimit       int64 // octets per APPEND message
	MaxErrors         int
	MaxUnauthCommands int
	ReadTimeout       time.Duration // autologout when authenticated
	UnauthTimeout     time.Duration // autologout before login
	WriteTimeout      time.Duration
	HandshakeTimeout  time.Duration
	// MinTransferRate (octets per second) and TransferGrace bound a whole
	// APPEND command: a client slower than that gets "* BYE" and nothing
	// is appended.
	MinTransferRate int64
	TransferGrace   time.Duration
	// CommandRate and CommandBurst are each connection's token bucket of
	// commands: over it a command gets NO [LIMIT] without running.
	CommandRate  float64
	CommandBurst int
	// Now is the clock of the command rate limit; nil means time.Now.
	Now func() time.Time
	// IdlePoll, if positive, makes IDLE also read the mailbox's change log
	// at this interval, for changes committed by other processes sharing
	// the store (several nodes on one Cassandra cluster); changes made
	// through this process wake IDLE at once through the mailbox hub.
	IdlePoll time.Duration

	once    sync.Once
	cfg     config
	cfgErr  error
	accept  textconn.Server
	session atomic.Uint64
}

// config is the Server's settings with defaults applied; read-only once
// built.
type config struct {
	hostname          string
	tls               *tls.Config
	implicitTLS       bool
	allowInsecureAuth bool
	backend           Backend
	log               *slog.Logger
	metrics           *textconn.Metrics
	maxLiteral        int64
	appendLimit       int64
	maxErrors         int
	maxUnauthCommands int
	readTimeout       time.Duration
	unauthTimeout     time.Duration
	minRate           int64
	transferGrace     time.Duration
	commandRate       float64
	commandBurst      int
	idlePoll          time.Duration
	now               func() time.Time
	conn              textconn.Options
}

func (s *Server) init() {
	s.once.Do(func() {
		c := config{
			hostname:          s.Hostname,
			tls:               s.TLSConfig,
			implicitTLS:       s.ImplicitTLS,
			allowInsecureAuth: s.AllowInsecureAuth,
			backend:           s.Backend,
			log:               s.Logger,
			metrics:           s.Metrics,
			maxLiteral:        positive(s.MaxLiteral, DefaultMaxLiteral),
			appendLimit:       positive(s.AppendLimit, DefaultAppendLimit),
			maxErrors:         positive(s.MaxErrors, DefaultMaxErrors),
			maxUnauthCommands: positive(s.MaxUnauthCommands, DefaultMaxUnauthCommands),
			readTimeout:       positive(s.ReadTimeout, DefaultReadTimeout),
			unauthTimeout:     positive(s.UnauthTimeout, DefaultUnauthTimeout),
			minRate:           positive(s.MinTransferRate, DefaultMinTransferRate),
			transferGrace:     positive(s.TransferGrace, DefaultTransferGrace),
			commandRate:       positive(s.CommandRate, DefaultCommandRate),
			commandBurst:      positive(s.CommandBurst, DefaultCommandBurst),
			idlePoll:          s.IdlePoll,
			now:               s.Now,
			conn: textconn.Options{
				MaxLine:          positive(s.MaxLineLength, DefaultMaxLineLength),
				WriteTimeout:     positive(s.WriteTimeout, DefaultWriteTimeout),
				HandshakeTimeout: positive(s.HandshakeTimeout, DefaultHandshakeTimeout),
				Metrics:          s.Metrics,
				// Sessions idle for most of their life (IDLE, a client
				// between polls) and the line buffer is 64 KiB.
				ReleaseIdle: true,
			},
		}
		c.conn.ReadTimeout = c.unauthTimeout
		if c.hostname == "" {
			if h, err := os.Hostname(); err == nil && h != "" {
				c.hostname = h
			} else {
				c.hostname = "localhost"
			}
		}
		if c.log == nil {
			c.log = slog.Default()
		}
		if c.now == nil {
			c.now = time.Now
		}
		name := s.Name
		if name == "" {
			name = "imap"
		}
		c.log = c.log.With("listener", name)
		switch {
		case c.backend == nil:
			s.cfgErr = errors.New("imap: Server.Backend is nil")
		case c.implicitTLS && c.tls == nil:
			s.cfgErr = errors.New("imap: Server.ImplicitTLS without TLSConfig")
		}
		s.cfg = c
		s.accept.Name = name
		s.accept.Handler = s.handle
		s.accept.Logger = c.log
		s.accept.Metrics = s.Metrics
		s.accept.Limiter = s.Limiter
		s.accept.LimitReply = "* BYE [UNAVAILABLE] too many connections, try again later\r\n"
		s.accept.OverloadReply = "* BYE [UNAVAILABLE] server overloaded, try again later\r\n"
	})
}

func positive[T int | int64 | float64 | time.Duration](v, def T) T {
	if v > 0 {
		return v
	}
	return def
}

// Serve accepts connections on ln until Shutdown or Close and then returns
// ErrServerClosed; it closes ln.
func (s *Server) Serve(ln net.Listener) error {
	s.init()
	if s.cfgErr != nil {
		ln.Close()
		return s.cfgErr
	}
	return s.accept.Serve(ln)
}

// Shutdown stops accepting and ends every session gracefully: a command in
// progress completes, idle clients (IDLE included) get "* BYE" and the
// connection closes. If ctx ends first the remaining connections are
// closed and ctx.Err() returned.
func (s *Server) Shutdown(ctx context.Context) error {
	s.init()
	return s.accept.Shutdown(ctx)
}

// Close closes the listeners and every connection at once.
func (s *Server) Close() error {
	s.init()
	return s.accept.Close()
}

func (s *Server) handle(ctx context.Context, nc net.Conn, shutdown <-chan struct{}) {
	conn := textconn.New(nc, s.cfg.conn)
	defer conn.Release()
	stop := conn.WatchShutdown(shutdown)
	defer stop()
	sess := &session{cfg: &s.cfg, conn: conn, remote: conn.RemoteAddr(), shutdown: shutdown,
		commands: newCommandBucket(s.cfg.commandRate, s.cfg.commandBurst, s.cfg.now())}
	sess.enc.w = conn
	sess.log = s.cfg.log.With("session", strconv.FormatUint(s.session.Add(1), 10), "remote", sess.remote.String())
	sess.serve(ctx)
}
