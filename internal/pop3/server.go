package pop3

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
	// DefaultMaxLineLength bounds every client line, CRLF excluded. RFC 2449
	// section 4 limits commands to 255 octets including CRLF; SASL
	// responses (RFC 5034 section 4) may be longer, so the limit is 1 KiB.
	DefaultMaxLineLength = 1024
	// DefaultMaxErrors is the number of -ERR replies caused by the client
	// (syntax, wrong state, bad credentials) after which the connection is
	// closed.
	DefaultMaxErrors = 10
	// DefaultMaxUnauthCommands bounds the commands before a successful
	// login; a real client needs about five (CAPA, STLS, CAPA, USER, PASS).
	DefaultMaxUnauthCommands = 20
	// DefaultReadTimeout is the inactivity autologout timer; RFC 1939
	// section 3 requires at least 10 minutes.
	DefaultReadTimeout = 10 * time.Minute
	// DefaultUnauthTimeout is the shorter timer before login: RFC 1939's
	// 10 minutes protect a logged-in user's session, and a client that
	// has not logged in has nothing to lose by reconnecting.
	DefaultUnauthTimeout = time.Minute
	// DefaultWriteTimeout bounds each network write; a client that does
	// not read a response for this long is gone.
	DefaultWriteTimeout = time.Minute
	// DefaultHandshakeTimeout bounds a TLS handshake.
	DefaultHandshakeTimeout = 30 * time.Second
)

// ErrServerClosed is returned by Serve after Shutdown or Close.
var ErrServerClosed = textconn.ErrServerClosed

// Server is a POP3 server. Set the fields before the first call to Serve;
// zero limits take the Default values above. Serve may be called for
// several listeners (e.g. 110 and, on another Server with ImplicitTLS, 995).
type Server struct {
	// Name labels the listener in logs; default "pop3".
	Name string
	// Hostname is announced in the greeting; default os.Hostname().
	Hostname string
	// TLSConfig enables STLS (RFC 2595), or implicit TLS with ImplicitTLS;
	// nil means no TLS.
	TLSConfig *tls.Config
	// ImplicitTLS starts TLS at connect (port 995 style, RFC 8314).
	ImplicitTLS bool
	// AllowInsecureAuth allows USER/PASS and AUTH without TLS from any
	// peer. Loopback peers are always allowed.
	AllowInsecureAuth bool
	// Backend authenticates users and opens maildrops. Required.
	Backend Backend
	// Logger receives the server's log; nil means slog.Default().
	// Credentials are never logged.
	Logger *slog.Logger
	// Metrics and Limiter are shared with other listeners; both may be nil.
	Metrics *textconn.Metrics
	Limiter *textconn.Limiter

	MaxLineLength     int           // octets per client line, CRLF excluded
	MaxErrors         int           // client-caused -ERR replies before close
	MaxUnauthCommands int           // commands before login before close
	ReadTimeout       time.Duration // autologout after login
	UnauthTimeout     time.Duration // autologout before login
	WriteTimeout      time.Duration
	HandshakeTimeout  time.Duration

	once    sync.Once
	cfg     config
	cfgErr  error
	accept  textconn.Server
	session atomic.Uint64 // session ids for the log
}

// config is the Server's settings with defaults applied; read-only once
// built, so sessions read it without locking.
type config struct {
	hostname          string
	tls               *tls.Config
	implicitTLS       bool
	allowInsecureAuth bool
	backend           Backend
	log               *slog.Logger
	metrics           *textconn.Metrics
	maxErrors         int
	maxUnauthCommands int
	readTimeout       time.Duration // after login; conn.ReadTimeout is the one before
	conn              textconn.Options
}

// init applies the defaults and validates, once.
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
			maxErrors:         positive(s.MaxErrors, DefaultMaxErrors),
			maxUnauthCommands: positive(s.MaxUnauthCommands, DefaultMaxUnauthCommands),
			readTimeout:       positive(s.ReadTimeout, DefaultReadTimeout),
			conn: textconn.Options{
				MaxLine:          positive(s.MaxLineLength, DefaultMaxLineLength),
				ReadTimeout:      positive(s.UnauthTimeout, DefaultUnauthTimeout),
				WriteTimeout:     positive(s.WriteTimeout, DefaultWriteTimeout),
				HandshakeTimeout: positive(s.HandshakeTimeout, DefaultHandshakeTimeout),
				Metrics:          s.Metrics,
				// A logged-in client may sit idle for the 10 minutes
				// RFC 1939 allows.
				ReleaseIdle: true,
			},
		}
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
		name := s.Name
		if name == "" {
			name = "pop3"
		}
		c.log = c.log.With("listener", name)
		switch {
		case c.backend == nil:
			s.cfgErr = errors.New("pop3: Server.Backend is nil")
		case c.implicitTLS && c.tls == nil:
			s.cfgErr = errors.New("pop3: Server.ImplicitTLS without TLSConfig")
		}
		s.cfg = c
		s.accept.Name = name
		s.accept.Handler = s.handle
		s.accept.Logger = c.log
		s.accept.Metrics = s.Metrics
		s.accept.Limiter = s.Limiter
		s.accept.LimitReply = "-ERR [SYS/TEMP] too many connections, try again later\r\n"
		s.accept.OverloadReply = "-ERR [SYS/TEMP] server overloaded, try again later\r\n"
	})
}

func positive[T int | time.Duration](v, def T) T {
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
// progress completes, idle clients get "-ERR [SYS/TEMP]" and the
// connection closes. Sessions that did not QUIT leave their maildrop
// unchanged (RFC 1939 section 6). If ctx ends first the remaining
// connections are closed and ctx.Err() returned.
func (s *Server) Shutdown(ctx context.Context) error {
	s.init()
	return s.accept.Shutdown(ctx)
}

// Close closes the listeners and every connection at once.
func (s *Server) Close() error {
	s.init()
	return s.accept.Close()
}

// handle serves one accepted connection (textconn.Handler).
func (s *Server) handle(ctx context.Context, nc net.Conn, shutdown <-chan struct{}) {
	conn := textconn.New(nc, s.cfg.conn)
	defer conn.Release()
	stop := conn.WatchShutdown(shutdown)
	defer stop()
	sess := &session{
		cfg:    &s.cfg,
		conn:   conn,
		remote: conn.RemoteAddr(),
	}
	sess.log = s.cfg.log.With("session", strconv.FormatUint(s.session.Add(1), 10), "remote", sess.remote.String())
	sess.serve(ctx)
	if sess.copyBuf != nil {
		copyBufs.Put(sess.copyBuf)
	}
}
