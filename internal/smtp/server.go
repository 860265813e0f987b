// Package smtp is Quill's SMTP front end: inbound MX (RFC 5321), message
// submission (RFC 6409, RFC 8314) and LMTP (RFC 2033), one implementation
// with a Mode. It parses commands, runs the session state machine, enforces
// the protocol limits and streams each message body to a Backend, replying
// 250 only for recipients whose delivery the Backend reports durable.
//
// Extensions: PIPELINING, SIZE, 8BITMIME, ENHANCEDSTATUSCODES, CHUNKING,
// SMTPUTF8, STARTTLS, and AUTH PLAIN/LOGIN on submission.
package smtp

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"quill/internal/delivery"
	"quill/internal/mail"
	"quill/internal/textconn"
)

// Backend is what the SMTP front end needs from the rest of Quill. Its
// methods are called from many sessions at once.
type Backend interface {
	// Authenticate verifies AUTH credentials (submission only). Errors: auth.ErrInvalidCredentials,
	// auth.ErrThrottled, auth.ErrDisabled, anything else = temporary failure.
	Authenticate(ctx context.Context, username, password string, remote netip.Addr) (user string, err error)
	// CheckSender: may authenticated user use `from` as envelope sender? delivery.ErrSenderNotAllowed if not.
	CheckSender(ctx context.Context, user string, from mail.Address) error
	// Resolve one RCPT. Errors: delivery.ErrRelayDenied, ErrOutboundDisabled, ErrNoSuchUser, ErrOverQuota,
	// ErrMailboxFull, ErrDisabled; anything else temporary.
	Resolve(ctx context.Context, rcpt mail.Address, opts delivery.ResolveOptions) (delivery.Recipient, error)
	// Deliver reads m.Body to EOF and returns per-recipient results (len == len(m.Recipients)); a nil
	// result means durable. err != nil means nothing was delivered (body read failure wrapped with %w, or storage).
	Deliver(ctx context.Context, m delivery.Message) (results []error, err error)
}

// Mode selects the protocol a Server speaks.
type Mode int

const (
	// ModeMX is inbound SMTP from the Internet (port 25): no AUTH, only
	// local recipients.
	ModeMX Mode = iota
	// ModeSubmission is authenticated message submission (587 with
	// STARTTLS, or 465 with ImplicitTLS): AUTH is required before MAIL.
	ModeSubmission
	// ModeLMTP is LMTP (RFC 2033) for an MTA in front of Quill: LHLO
	// instead of EHLO, and one reply per recipient after the message.
	ModeLMTP
)

func (m Mode) String() string {
	switch m {
	case ModeMX:
		return "smtp"
	case ModeSubmission:
		return "submission"
	case ModeLMTP:
		return "lmtp"
	}
	return fmt.Sprintf("Mode(%d)", int(m))
}

// Defaults for the limits, applied by Server when a field is zero.
const (
	// DefaultMaxLineLength is the command line limit of RFC 5321 section
	// 4.5.3.1.4 (512 octets with CRLF; Quill does not count the CRLF).
	DefaultMaxLineLength = 512
	// DefaultMaxDataLineLength bounds a text line of a message. RFC 5321
	// section 4.5.3.1.6 says 1000 octets, but real mail (generated HTML)
	// exceeds it; 64 KiB accepts that while keeping memory bounded.
	DefaultMaxDataLineLength = 64 << 10
	// DefaultMaxMessageBytes is what large mailbox providers accept.
	DefaultMaxMessageBytes = 50 << 20
	// DefaultMaxRecipients is the minimum RFC 5321 section 4.5.3.1.8
	// requires a server to accept.
	DefaultMaxRecipients = 100
	// DefaultMaxErrors is the number of failed commands after which the
	// session ends with 421 (as Postfix's smtpd_hard_error_limit).
	DefaultMaxErrors = 20
	// DefaultMaxCommandsBeforeAuth bounds an unauthenticated submission
	// session; a real client needs about five commands.
	DefaultMaxCommandsBeforeAuth = 20
	// DefaultReadTimeout is the server timeout of RFC 5321 section
	// 4.5.3.2.7 (5 minutes awaiting a command).
	DefaultReadTimeout = 5 * time.Minute
	// DefaultDataTimeout bounds each read of a message body (RFC 5321
	// section 4.5.3.2.5 gives a client 3 minutes per data block, the server
	// 10 minutes for the whole).
	DefaultDataTimeout = 10 * time.Minute
	// DefaultWriteTimeout bounds each write to a client.
	DefaultWriteTimeout = 1 * time.Minute
	// DefaultHandshakeTimeout bounds a TLS handshake (implicit TLS and
	// STARTTLS): a real client completes one in well under a second.
	DefaultHandshakeTimeout = 30 * time.Second
	// DefaultPreauthTimeout is the command timeout before a client has
	// said EHLO/HELO/LHLO (MX, LMTP) or authenticated (submission). A
	// real MTA sends EHLO at once after the greeting, a real MUA
	// authenticates within seconds; RFC 5321's 5 minutes then apply.
	DefaultPreauthTimeout = time.Minute
	// DefaultMinTransferRate and DefaultTransferGrace bound how slowly a
	// message body may arrive (textconn.Conn.BeginTransfer): 1 KiB/s is
	// 8 kbit/s, below any link still in use, after 30 s for TCP slow start
	// and a client that composes the body as it sends it.
	DefaultMinTransferRate = 1 << 10
	DefaultTransferGrace   = 30 * time.Second
	// maxAuthLineLength is the longest AUTH command or SASL response, RFC
	// 4954 section 4.
	maxAuthLineLength = 12288
)

// Server is an SMTP, submission or LMTP server. Set the fields before the
// first Serve and do not change them afterwards. Zero limits take the
// Default values.
type Server struct {
	Mode     Mode
	Hostname string // this host's name in the greeting and trace fields
	// TLSConfig enables STARTTLS (RFC 3207), or implicit TLS with
	// ImplicitTLS (RFC 8314 section 3); nil means plaintext only.
	TLSConfig   *tls.Config
	ImplicitTLS bool
	// AllowInsecureAuth offers AUTH without TLS. Loopback peers may always
	// authenticate in plaintext.
	AllowInsecureAuth bool

	Backend Backend
	Logger  *slog.Logger      // nil: slog.Default()
	Metrics *textconn.Metrics // may be nil
	Limiter *textconn.Limiter // may be nil
	// Now is the clock for trace fields; nil: time.Now.
	Now func() time.Time

	MaxLineLength         int   // command line, CRLF excluded
	MaxDataLineLength     int   // message text line, CRLF excluded
	MaxMessageBytes       int64 // message as received, trace fields excluded
	MaxRecipients         int
	MaxErrors             int           // failed commands before 421
	MaxCommandsBeforeAuth int           // submission only
	ReadTimeout           time.Duration // awaiting a command once identified or authenticated
	PreauthTimeout        time.Duration // awaiting a command before (DefaultPreauthTimeout)
	DataTimeout           time.Duration // each read of a message body
	WriteTimeout          time.Duration
	HandshakeTimeout      time.Duration
	// MinTransferRate (octets per second) and TransferGrace bound the
	// whole of a DATA or BDAT body: a client slower than that is told
	// 421 4.4.2 and disconnected, and nothing is delivered.
	MinTransferRate int64
	TransferGrace   time.Duration

	once sync.Once
	lim  limits
	srv  textconn.Server
	// sessions counts sessions for their IDs, idPrefix is these IDs'
	// random prefix (newSessionID).
	sessions atomic.Uint64
	idPrefix uint32
	// ehloKeywords are the EHLO keywords every session offers.
	ehloKeywords []string
}

// limits are the effective limits, defaults applied.
type limits struct {
	maxLine, maxDataLine, maxRecipients, maxErrors, maxBeforeAuth int
	maxMessage, minRate                                           int64
	readTimeout, preauthTimeout, dataTimeout, writeTimeout        time.Duration
	handshakeTimeout, transferGrace                               time.Duration
}

func orDefault[T int | int64 | time.Duration](v, def T) T {
	if v > 0 {
		return v
	}
	return def
}

func (s *Server) init() {
	s.once.Do(func() {
		var p [4]byte
		_, _ = rand.Read(p[:])
		s.idPrefix = binary.BigEndian.Uint32(p[:])
		s.lim = limits{
			maxLine:          orDefault(s.MaxLineLength, DefaultMaxLineLength),
			maxDataLine:      orDefault(s.MaxDataLineLength, DefaultMaxDataLineLength),
			maxRecipients:    orDefault(s.MaxRecipients, DefaultMaxRecipients),
			maxErrors:        orDefault(s.MaxErrors, DefaultMaxErrors),
			maxBeforeAuth:    orDefault(s.MaxCommandsBeforeAuth, DefaultMaxCommandsBeforeAuth),
			maxMessage:       orDefault(s.MaxMessageBytes, DefaultMaxMessageBytes),
			readTimeout:      orDefault(s.ReadTimeout, DefaultReadTimeout),
			dataTimeout:      orDefault(s.DataTimeout, DefaultDataTimeout),
			writeTimeout:     orDefault(s.WriteTimeout, DefaultWriteTimeout),
			minRate:          orDefault(s.MinTransferRate, DefaultMinTransferRate),
			transferGrace:    orDefault(s.TransferGrace, DefaultTransferGrace),
			preauthTimeout:   orDefault(s.PreauthTimeout, DefaultPreauthTimeout),
			handshakeTimeout: orDefault(s.HandshakeTimeout, DefaultHandshakeTimeout),
		}
		s.ehloKeywords = []string{"PIPELINING", "SIZE " + strconv.FormatInt(s.lim.maxMessage, 10),
			"8BITMIME", "ENHANCEDSTATUSCODES", "CHUNKING", "SMTPUTF8"}
		s.srv = textconn.Server{
			Name:       s.Mode.String(),
			Handler:    s.handle,
			Logger:     s.logger(),
			Metrics:    s.Metrics,
			Limiter:    s.Limiter,
			LimitReply: fmt.Sprintf("421 4.7.0 %s Too many connections, try again later\r\n", s.Hostname),
			// RFC 3463 4.3.2: system not accepting network messages.
			OverloadReply: fmt.Sprintf("421 4.3.2 %s Service overloaded, try again later\r\n", s.Hostname),
		}
	})
}

func (s *Server) logger() *slog.Logger {
	if s.Logger != nil {
		return s.Logger
	}
	return slog.Default()
}

func (s *Server) now() time.Time {
	if s.Now != nil {
		return s.Now()
	}
	return time.Now()
}

// Serve accepts connections on ln until Shutdown or Close and returns
// textconn.ErrServerClosed then.
func (s *Server) Serve(ln net.Listener) error {
	if s.Backend == nil || s.Hostname == "" {
		return errors.New("smtp: Server needs Backend and Hostname")
	}
	if s.ImplicitTLS && s.TLSConfig == nil {
		return errors.New("smtp: ImplicitTLS needs TLSConfig")
	}
	s.init()
	return s.srv.Serve(ln)
}

// Shutdown stops accepting and lets every session finish its current
// command; idle sessions are told 421 and closed. If ctx ends first the
// remaining connections are closed and ctx.Err() returned.
func (s *Server) Shutdown(ctx context.Context) error {
	s.init()
	return s.srv.Shutdown(ctx)
}

// Close closes the listeners and every connection now.
func (s *Server) Close() error {
	s.init()
	return s.srv.Close()
}

func (s *Server) handle(ctx context.Context, nc net.Conn, shutdown <-chan struct{}) {
	maxLine := s.lim.maxLine
	if s.Mode == ModeSubmission {
		maxLine = max(maxLine, maxAuthLineLength)
	}
	conn := textconn.New(nc, textconn.Options{
		MaxLine:          maxLine,
		ReadTimeout:      s.lim.preauthTimeout,
		WriteTimeout:     s.lim.writeTimeout,
		HandshakeTimeout: s.lim.handshakeTimeout,
		Metrics:          s.Metrics,
	})
	defer conn.Release()
	stop := conn.WatchShutdown(shutdown)
	defer stop()
	sess := newSession(ctx, s, conn)
	sess.serve()
}
