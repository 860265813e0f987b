package delivery

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"quill/internal/mail"
	"quill/internal/mime"
	"quill/internal/store"
)

// Store is what delivery needs from the store.
type Store interface {
	Resolve(ctx context.Context, address string) (string, error)
	GetUser(ctx context.Context, address string) (store.User, error)
	GetMailbox(ctx context.Context, user, name string) (store.Mailbox, error)
	Usage(ctx context.Context, user string) (store.Usage, error)
	PutBlob(ctx context.Context, r io.Reader, maxSize int64) (store.ID, int64, error)
	Append(ctx context.Context, mailbox store.ID, msgs []store.NewMessage, opts store.AppendOptions) ([]store.Message, error)
}

// RoomKnower is a Store that may know, without reading anything, whether
// a user has room for a message (usermgr.Manager, from the usage it keeps
// of the users it manages): Resolve's quota check then costs no read of
// the user's mailboxes (on Cassandra, one per mailbox). known false: read
// the usage.
type RoomKnower interface {
	KnownRoom(user string, quota, size int64) (room, known bool)
}

// Options configure an Agent.
type Options struct {
	// Domains are the local domains; mail for any other domain is relay.
	// The first is the primary domain.
	Domains []string
	// Hostname is this node's name: "postmaster@Hostname" (which is also
	// what a bare "<postmaster>" becomes) reaches the primary domain's
	// postmaster, as RFC 5321 section 4.5.1 requires.
	Hostname string
	// SubaddressSeparator, if set, lets user+detail@domain reach
	// user@domain when no user or alias has the full address (RFC 5233).
	SubaddressSeparator string
	// MaxMessageBytes bounds a stored message (0: unbounded; the protocol
	// layer bounds it too).
	MaxMessageBytes int64
	// LazySummaries stores messages without a summary (store.Message.Meta),
	// for a server that serves no IMAP: POP3 never reads one, and the first
	// IMAP command that needs one computes it and keeps it
	// (store.MetaSetter, docs/adr/0011).
	LazySummaries bool
	// Budget, if not nil, bounds the octets of bodies in flight: each
	// body is charged as it is read and released when Deliver returns.
	Budget *Budget
	// DirectoryTTL, if positive, is how long a recipient's user record
	// is remembered (userCache): a change to a user or an alias then
	// reaches this node's deliveries within it. Zero looks every
	// recipient up.
	DirectoryTTL time.Duration
	Logger       *slog.Logger
	Registerer   prometheus.Registerer
}

// inlineMax is the largest body delivered inline with its append
// (store.NewMessage.Body) rather than stored by PutBlob first: one store
// write instead of two for the common message to one mailbox, at the cost
// of holding the body in memory, as PutBlob's chunk buffer does anyway.
const inlineMax = 256 << 10

// inlineBufs recycles the inlineMax-sized read buffers of Deliver.
var inlineBufs = sync.Pool{New: func() any { b := make([]byte, inlineMax); return &b }}

// Agent delivers messages into local INBOXes. It is safe for concurrent use.
type Agent struct {
	st      Store
	opts    Options
	log     *slog.Logger
	domains map[string]bool

	inboxes *store.InboxIDs // users' INBOXes, until an append to one fails
	users   *userCache      // nil: no DirectoryTTL

	delivered *prometheus.CounterVec
	bytes     prometheus.Counter
}

// NewAgent returns an Agent over st.
func NewAgent(st Store, opts Options) *Agent {
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	a := &Agent{
		st: st, opts: opts, log: opts.Logger, domains: map[string]bool{}, inboxes: store.NewInboxIDs(maxInboxes),
		delivered: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "quill_deliveries_total",
			Help: "Per-recipient delivery outcomes (ok, over_quota, unknown: stored or not, error).",
		}, []string{"result"}),
		bytes: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "quill_delivered_bytes_total",
			Help: "Bytes of message bodies stored by delivery (once per message, not per recipient).",
		}),
	}
	if opts.DirectoryTTL > 0 {
		a.users = &userCache{ttl: opts.DirectoryTTL, m: map[string]cachedUser{}}
	}
	for _, d := range opts.Domains {
		a.domains[normalizeDomain(d)] = true
	}
	if opts.Registerer != nil {
		opts.Registerer.MustRegister(a.delivered, a.bytes)
	}
	return a
}

// IsLocal reports whether domain is one of the local domains.
func (a *Agent) IsLocal(domain string) bool {
	return a.domains[normalizeDomain(domain)]
}

func normalizeDomain(d string) string { return strings.ToLower(strings.TrimSuffix(d, ".")) }

// Resolve checks one recipient: its domain must be local and the address a
// user or alias (or, with subaddressing, user+detail), and the user must
// have room for opts.Size more bytes.
func (a *Agent) Resolve(ctx context.Context, rcpt mail.Address, opts ResolveOptions) (Recipient, error) {
	domain := normalizeDomain(rcpt.Domain)
	if strings.EqualFold(rcpt.Local, "postmaster") && a.opts.Hostname != "" && len(a.opts.Domains) > 0 &&
		domain == strings.ToLower(a.opts.Hostname) {
		domain = normalizeDomain(a.opts.Domains[0])
	}
	if !a.IsLocal(domain) {
		if opts.Authenticated {
			return Recipient{}, ErrOutboundDisabled
		}
		return Recipient{}, ErrRelayDenied
	}
	local := strings.ToLower(rcpt.Local)
	u, err := a.user(ctx, local+"@"+domain)
	if errors.Is(err, ErrNoSuchUser) && a.opts.SubaddressSeparator != "" {
		if base, _, ok := strings.Cut(local, a.opts.SubaddressSeparator); ok && base != "" {
			u, err = a.user(ctx, base+"@"+domain)
		}
	}
	if err != nil {
		return Recipient{}, err
	}
	if u.Status == store.UserDisabled {
		return Recipient{}, ErrDisabled
	}
	if u.QuotaBytes > 0 {
		if opts.Size > u.QuotaBytes {
			return Recipient{}, ErrOverQuota
		}
		room, known := false, false
		if k, ok := a.st.(RoomKnower); ok {
			room, known = k.KnownRoom(u.Address, u.QuotaBytes, opts.Size)
		}
		if !known {
			usage, err := a.st.Usage(ctx, u.Address)
			if err != nil {
				return Recipient{}, fmt.Errorf("delivery: usage of %s: %w", u.Address, err)
			}
			room = usage.Bytes < u.QuotaBytes && usage.Bytes+opts.Size <= u.QuotaBytes
		}
		if !room {
			return Recipient{}, ErrMailboxFull
		}
	}
	return Recipient{Address: rcpt, User: u.Address, Quota: u.QuotaBytes}, nil
}

// user returns the user an address delivers to: the user of that address,
// or an alias's target. The common case, a user's own address, costs one
// store lookup, or none while the cache remembers it.
func (a *Agent) user(ctx context.Context, addr string) (store.User, error) {
	if a.users == nil {
		return a.lookup(ctx, addr)
	}
	now := time.Now()
	if u, ok := a.users.get(addr, now); ok {
		return u, nil
	}
	u, err := a.lookup(ctx, addr)
	if err == nil {
		kept := u
		kept.PasswordHash = "" // delivery never needs it
		a.users.put(addr, kept, now)
	}
	return u, err
}

func (a *Agent) lookup(ctx context.Context, addr string) (store.User, error) {
	u, err := a.st.GetUser(ctx, addr)
	if errors.Is(err, store.ErrNotFound) {
		target, rerr := a.st.Resolve(ctx, addr)
		if errors.Is(rerr, store.ErrNotFound) {
			return store.User{}, ErrNoSuchUser
		}
		if rerr != nil {
			return store.User{}, fmt.Errorf("delivery: resolving %s: %w", addr, rerr)
		}
		u, err = a.st.GetUser(ctx, target)
		if errors.Is(err, store.ErrNotFound) {
			return store.User{}, ErrNoSuchUser
		}
	}
	if err != nil {
		return store.User{}, fmt.Errorf("delivery: reading %s: %w", addr, err)
	}
	return u, nil
}

// CheckSender reports whether the authenticated user may send as from: its
// own address or an alias of it (RFC 6409 section 6.1).
func (a *Agent) CheckSender(ctx context.Context, user string, from mail.Address) error {
	if from.IsNull() {
		return ErrSenderNotAllowed
	}
	owner, err := a.st.Resolve(ctx, from.Normalized())
	if errors.Is(err, store.ErrNotFound) || (err == nil && owner != user) {
		return ErrSenderNotAllowed
	}
	if err != nil {
		return fmt.Errorf("delivery: resolving sender %s: %w", from, err)
	}
	return nil
}

// Deliver stores m.Body once and appends it to the INBOX of every
// recipient. It returns one result per recipient (nil: durably delivered)
// or, if the body could not be stored at all, an error and no results.
// Recipients that resolve to the same user get the message once and share
// its result. Unless LazySummaries, the message's summary (internal/mime) is
// computed while the body is read and kept as every copy's Meta.
func (a *Agent) Deliver(ctx context.Context, m Message) ([]error, error) {
	first := map[string]int{} // user -> index of its first recipient
	var unique []int
	for i, r := range m.Recipients {
		if _, dup := first[r.User]; !dup {
			first[r.User] = i
			unique = append(unique, i)
		}
	}
	// The body is held against the budget until it is durable (or
	// abandoned): until then the store's buffers and transactions may
	// hold it.
	hold := a.opts.Budget.Hold()
	defer hold.Release()
	var parser *mime.Parser
	body := hold.Reader(m.Body)
	if !a.opts.LazySummaries {
		parser = mime.NewParser()
		body = io.TeeReader(body, parser)
	}
	nm := store.NewMessage{InternalDate: m.ReceivedAt}
	if len(unique) == 1 {
		// One mailbox: a body that fits inlineMax goes to the store with
		// the append, in one write.
		bufp := inlineBufs.Get().(*[]byte)
		defer inlineBufs.Put(bufp)
		buf := *bufp
		// store.FillChunk, like PutBlob: only io.EOF ends a body, so a
		// client gone mid-message is an error, never a shorter message.
		n, eof, err := store.FillChunk(body, buf)
		switch {
		case err != nil:
			return nil, fmt.Errorf("delivery: reading body: %w", err)
		case eof:
			if limit := a.opts.MaxMessageBytes; limit > 0 && int64(n) > limit {
				return nil, fmt.Errorf("delivery: storing body: %d octets, over the limit of %d", n, limit)
			}
			nm.Body, nm.Size = buf[:n], int64(n)
		default:
			body = io.MultiReader(bytes.NewReader(buf[:n]), body)
		}
	}
	if nm.Body == nil {
		blob, size, err := a.st.PutBlob(ctx, body, a.opts.MaxMessageBytes)
		if err != nil {
			return nil, fmt.Errorf("delivery: storing body: %w", err)
		}
		nm.Blob, nm.Size = blob, size
	}
	a.bytes.Add(float64(nm.Size))
	if parser != nil {
		nm.Meta = a.summary(parser, nm.Size)
	}
	results := make([]error, len(m.Recipients))
	if len(unique) == 1 {
		results[unique[0]] = a.appendInbox(ctx, m.Recipients[unique[0]], nm)
	} else {
		// Concurrent appends land in the same commit group: one fsync for
		// all recipients.
		var wg sync.WaitGroup
		for _, i := range unique {
			wg.Add(1)
			go func() {
				defer wg.Done()
				results[i] = a.appendInbox(ctx, m.Recipients[i], nm)
			}()
		}
		wg.Wait()
	}
	for i, r := range m.Recipients {
		results[i] = results[first[r.User]]
		switch {
		case results[i] == nil:
			a.delivered.WithLabelValues("ok").Inc()
		case errors.Is(results[i], ErrMailboxFull):
			a.delivered.WithLabelValues("over_quota").Inc()
		case errors.Is(results[i], ErrOutcomeUnknown):
			// Logged by the front end, which answers it (ADR 0030).
			a.delivered.WithLabelValues("unknown").Inc()
		default:
			a.delivered.WithLabelValues("error").Inc()
			a.log.Error("delivery failed", "user", r.User, "err", results[i])
		}
	}
	return results, nil
}

// summary returns the encoded summary of the body parser read, or nil if
// it cannot be kept: it must describe exactly the size octets stored, and
// a message stored without one is parsed by its readers.
func (a *Agent) summary(parser *mime.Parser, size int64) []byte {
	sum := parser.Summary()
	if sum.Size != size {
		a.log.Error("message summary does not match the stored body", "summary_size", sum.Size, "size", size)
		return nil
	}
	meta, err := sum.MarshalBinary()
	if err != nil {
		a.log.Error("encoding message summary", "err", err)
		return nil
	}
	if sum.Anomalies != 0 {
		a.log.Debug("malformed message stored", "anomalies", sum.Anomalies.String())
	}
	return meta
}

func (a *Agent) appendInbox(ctx context.Context, r Recipient, nm store.NewMessage) error {
	user := r.User
	for attempt := 0; ; attempt++ {
		inbox, err := a.inbox(ctx, user)
		if err != nil {
			return err
		}
		_, err = a.st.Append(ctx, inbox, []store.NewMessage{nm}, store.AppendOptions{CheckQuota: true, UserQuota: &r.Quota, Deferrable: true})
		switch {
		case err == nil:
			return nil
		case errors.Is(err, store.ErrOverQuota):
			return ErrMailboxFull
		case errors.Is(err, store.ErrNotFound) && attempt == 0:
			// The user was deleted and re-created since the INBOX was cached.
			a.inboxes.Forget(user)
		default:
			return fmt.Errorf("delivery: appending for %s: %w", user, err)
		}
	}
}

func (a *Agent) inbox(ctx context.Context, user string) (store.ID, error) {
	if id, ok := a.inboxes.Get(user); ok {
		return id, nil
	}
	m, err := a.st.GetMailbox(ctx, user, "INBOX")
	if errors.Is(err, store.ErrNotFound) {
		return store.ID{}, ErrNoSuchUser
	}
	if err != nil {
		return store.ID{}, fmt.Errorf("delivery: INBOX of %s: %w", user, err)
	}
	a.inboxes.Put(user, m.ID)
	return m.ID, nil
}
