package server

import (
	"context"
	"crypto/tls"
	"io"
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"quill/internal/auth"
	"quill/internal/config"
	"quill/internal/delivery"
	"quill/internal/imap"
	"quill/internal/mailbox"
	"quill/internal/textconn"
)

// imapBackend joins authentication and the IMAP mailbox service into what
// the IMAP front end needs.
type imapBackend struct {
	*auth.Authenticator
	mailboxes *mailbox.Mailboxes
	budget    *delivery.Budget
}

var _ imap.Backend = imapBackend{}

func (b imapBackend) Mailboxes(ctx context.Context, user string) (imap.Mailboxes, error) {
	return imapUser{b.mailboxes.User(user), b.budget}, nil
}

// imapUser adapts mailbox.User, whose Select returns the concrete view,
// to imap.Mailboxes.
type imapUser struct {
	*mailbox.User
	budget *delivery.Budget
}

// PutBody charges an APPEND literal to the body memory budget while it is
// read and stored. An inline body stays in memory until its Append, at
// most mailbox.InlineBodyMax per command, so its charge ends here too.
func (u imapUser) PutBody(ctx context.Context, r io.Reader, size int64, inline bool) (mailbox.Body, error) {
	hold := u.budget.Hold()
	defer hold.Release()
	return u.User.PutBody(ctx, hold.Reader(r), size, inline)
}

func (u imapUser) Select(ctx context.Context, name string, readOnly bool) (imap.View, mailbox.SelectInfo, error) {
	v, info, err := u.User.Select(ctx, name, readOnly)
	if err != nil {
		return nil, info, err
	}
	return v, info, nil
}

// imapServers builds the IMAP front end for one listener. Every IMAP
// listener shares the Authenticator, the connection Limiter, the TLS
// configuration and the mailbox service (whose Hub the delivery Agent
// notifies, so IDLE wakes on SMTP delivery).
type imapServers struct {
	cfg     config.Config
	log     *slog.Logger
	reg     prometheus.Registerer
	tls     *tls.Config
	limiter *textconn.Limiter
	backend imapBackend
}

func (x imapServers) new(name string, implicit bool) *imap.Server {
	return &imap.Server{
		Name: name, Hostname: x.cfg.Hostname, TLSConfig: x.tls, ImplicitTLS: implicit,
		AllowInsecureAuth: x.cfg.Auth.AllowInsecure,
		Backend:           x.backend,
		Logger:            x.log, // the IMAP server labels its log with Name
		Metrics:           textconn.NewMetrics(x.reg, name),
		Limiter:           x.limiter,
		AppendLimit:       x.cfg.Limits.MaxMessageBytes,
		MaxErrors:         x.cfg.Limits.MaxErrors,
		IdlePoll:          idlePoll(x.cfg),
		UnauthTimeout:     x.cfg.Limits.PreauthTimeout.Duration,
		HandshakeTimeout:  x.cfg.Limits.TLSHandshakeTimeout.Duration,
		MinTransferRate:   x.cfg.Limits.MinTransferRate,
		TransferGrace:     x.cfg.Limits.TransferGrace.Duration,
	}
}

// idlePoll is how often IDLE reads the change log: only when other nodes
// may change the store (Cassandra); one process's own changes reach IDLE
// through the hub.
func idlePoll(cfg config.Config) time.Duration {
	if cfg.Store.Engine == "cassandra" {
		return cfg.Store.Cassandra.IdlePoll.Duration
	}
	return 0
}
