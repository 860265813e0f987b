// Package auth authenticates users: the user directory over the store, the
// argon2id password KDF, SASL message parsing and the throttling of
// authentication failures per remote IP and per user.
package auth

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"runtime"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"quill/internal/store"
	"quill/internal/textconn"
)

// UserStore is what authentication needs from the store.
type UserStore interface {
	Resolve(ctx context.Context, address string) (string, error)
	GetUser(ctx context.Context, address string) (store.User, error)
}

// Options configure an Authenticator; zero values take the defaults noted.
type Options struct {
	// DefaultDomain completes a login name without "@" (none if empty).
	DefaultDomain string
	// MaxFailures within FailureWindow from one peer or for one account
	// before further attempts are refused with ErrThrottled (default 10 per
	// 5 min per peer, the same per account). Attempts in progress count
	// too. A peer is an IPv4 address or an IPv6 /64 (textconn.PeerKey); an
	// account is the canonical user a login or alias resolves to, or the
	// normalized login when it names no user.
	MaxFailures   int
	FailureWindow time.Duration
	// TrustedNetworks are exempt from counting per peer (a webmail or a
	// proxy that authenticates many users from one address); their
	// attempts still count per account. None by default: loopback is not
	// trusted unless listed.
	TrustedNetworks []netip.Prefix
	// CacheTTL is how long a verified login is remembered so that frequent
	// POP3/IMAP logins do not each pay for the KDF (default 5 min; a
	// negative value disables the cache). Changing the password invalidates
	// the entry, since the stored hash is part of its key.
	CacheTTL time.Duration
	// KDFMemoryBudget bounds the memory of the password checks running at
	// once, and KDFConcurrency their number (defaults: 256 MiB, and
	// GOMAXPROCS, since each check is one core's work). A check that finds
	// no room waits at most KDFWait (default 5 s), then fails with ErrBusy.
	KDFMemoryBudget int64
	KDFConcurrency  int
	KDFWait         time.Duration
	// ReleaseMemory, if set, is called (on its own goroutine, at most every
	// 10 s) when the KDF pool goes idle after checks worth its whole
	// budget, to hand the freed hash memory back (debug.FreeOSMemory).
	ReleaseMemory func()
	Logger        *slog.Logger
	Registry      prometheus.Registerer
	Now           func() time.Time
}

// Authenticator verifies credentials. It is safe for concurrent use.
type Authenticator struct {
	users  UserStore
	opts   Options
	log    *slog.Logger
	byIP   *throttle
	byUser *throttle
	kdf    *kdfPool

	cacheMu sync.Mutex
	cache   map[[32]byte]time.Time // verified (user, password, hash) -> expiry

	attempts *prometheus.CounterVec
}

const maxCacheEntries = 100_000

// NewAuthenticator returns an Authenticator over users.
func NewAuthenticator(users UserStore, opts Options) *Authenticator {
	if opts.MaxFailures == 0 {
		opts.MaxFailures = 10
	}
	if opts.FailureWindow == 0 {
		opts.FailureWindow = 5 * time.Minute
	}
	if opts.CacheTTL == 0 {
		opts.CacheTTL = 5 * time.Minute
	}
	if opts.KDFMemoryBudget <= 0 {
		opts.KDFMemoryBudget = 256 << 20
	}
	if opts.KDFConcurrency <= 0 {
		opts.KDFConcurrency = runtime.GOMAXPROCS(0)
	}
	if opts.KDFWait <= 0 {
		opts.KDFWait = 5 * time.Second
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	pool := newKDFPool(opts.KDFMemoryBudget, opts.KDFConcurrency, opts.KDFWait)
	pool.onIdle = opts.ReleaseMemory
	a := &Authenticator{
		users:  users,
		opts:   opts,
		log:    opts.Logger,
		byIP:   newThrottle(opts.MaxFailures, opts.FailureWindow, 100_000, opts.Now),
		byUser: newThrottle(opts.MaxFailures, opts.FailureWindow, 100_000, opts.Now),
		kdf:    pool,
		cache:  map[[32]byte]time.Time{},
		attempts: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "quill_auth_attempts_total",
			Help: "Authentication attempts by result (ok, invalid, throttled, busy, disabled, error).",
		}, []string{"result"}),
	}
	if opts.Registry != nil {
		opts.Registry.MustRegister(a.attempts,
			prometheus.NewGaugeFunc(prometheus.GaugeOpts{
				Name: "quill_auth_kdf_waiting",
				Help: "Password checks waiting for room in the KDF pool.",
			}, func() float64 { _, w := a.kdf.load(); return float64(w) }),
			prometheus.NewGaugeFunc(prometheus.GaugeOpts{
				Name: "quill_auth_kdf_memory_bytes",
				Help: "Share of auth.kdf_memory_budget held by the password checks running.",
			}, func() float64 { u, _ := a.kdf.load(); return float64(u) }))
	}
	return a
}

// NormalizeLogin maps a login name to the address form the directory uses.
func (a *Authenticator) NormalizeLogin(username string) string {
	u := strings.ToLower(strings.TrimSpace(username))
	if !strings.Contains(u, "@") && a.opts.DefaultDomain != "" {
		u += "@" + strings.ToLower(a.opts.DefaultDomain)
	}
	return u
}

// Authenticate verifies a username (an address or alias, or a local part
// of the default domain) and password and returns the canonical user. It
// returns ErrInvalidCredentials, ErrThrottled, ErrBusy or ErrDisabled, or
// a wrapped storage or context error (temporary).
//
// Throttling: the attempt is counted against the peer and the account
// before the password is checked, atomically with the check against the
// limit (waiting while the limit is reached only by attempts in progress),
// and stays counted if it fails. A success withdraws its own count
// from the peer (never the peer's failures: one valid account must not buy
// guesses at others) and clears the account's failures. An attempt that
// ends in neither (disabled account, pool busy, storage error) withdraws
// both counts.
func (a *Authenticator) Authenticate(ctx context.Context, username, password string, remote netip.Addr) (string, error) {
	login := a.NormalizeLogin(username)
	account, err := a.resolve(ctx, login)
	if err != nil {
		a.attempts.WithLabelValues("error").Inc()
		return "", err
	}
	userKey := account
	if userKey == "" {
		userKey = login
	}
	ipKey := a.peerKey(remote)
	refused := func(err error) (string, error) {
		if errors.Is(err, ErrThrottled) {
			a.attempts.WithLabelValues("throttled").Inc()
		} else {
			a.attempts.WithLabelValues("error").Inc()
		}
		return "", err
	}
	var ipAt time.Time
	if ipKey != "" {
		if ipAt, err = a.byIP.reserve(ctx, ipKey); err != nil {
			return refused(err)
		}
	}
	userAt, err := a.byUser.reserve(ctx, userKey)
	if err != nil {
		if ipKey != "" {
			a.byIP.cancel(ipKey, ipAt)
		}
		return refused(err)
	}
	withdraw := func() {
		if ipKey != "" {
			a.byIP.cancel(ipKey, ipAt)
		}
		a.byUser.cancel(userKey, userAt)
	}
	user, err := a.verify(ctx, account, password)
	switch {
	case errors.Is(err, ErrInvalidCredentials):
		if ipKey != "" {
			a.byIP.fail(ipKey)
		}
		a.byUser.fail(userKey)
		a.attempts.WithLabelValues("invalid").Inc()
		a.log.Info("authentication failed", "login", login, "remote", remote)
		return "", err
	case errors.Is(err, ErrDisabled):
		withdraw()
		a.attempts.WithLabelValues("disabled").Inc()
		return "", err
	case errors.Is(err, ErrBusy):
		withdraw()
		a.attempts.WithLabelValues("busy").Inc()
		return "", err
	case err != nil:
		withdraw()
		a.attempts.WithLabelValues("error").Inc()
		return "", err
	}
	if ipKey != "" {
		a.byIP.cancel(ipKey, ipAt)
	}
	a.byUser.clear(userKey)
	a.attempts.WithLabelValues("ok").Inc()
	return user, nil
}

// peerKey is the per-peer throttle key of remote, "" for a peer that is
// not counted (no IP address, or a trusted network).
func (a *Authenticator) peerKey(remote netip.Addr) string {
	if !remote.IsValid() {
		return ""
	}
	remote = remote.Unmap()
	for _, p := range a.opts.TrustedNetworks {
		if p.Contains(remote) {
			return ""
		}
	}
	return textconn.PeerKey(remote).String()
}

// resolve returns the canonical account login names, "" if none.
func (a *Authenticator) resolve(ctx context.Context, login string) (string, error) {
	if login == "" {
		return "", nil
	}
	user, err := a.users.Resolve(ctx, login)
	if errors.Is(err, store.ErrNotFound) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("auth: resolving %s: %w", login, err)
	}
	return user, nil
}

// verify checks password for account ("" when the login named no user).
func (a *Authenticator) verify(ctx context.Context, account, password string) (string, error) {
	if password == "" {
		return "", ErrInvalidCredentials
	}
	if account == "" {
		// Spend the KDF anyway, through the same pool, so that timing does
		// not reveal which users exist.
		if _, err := a.checkHash(ctx, dummyHash(), password); err != nil {
			return "", err
		}
		return "", ErrInvalidCredentials
	}
	u, err := a.users.GetUser(ctx, account)
	if errors.Is(err, store.ErrNotFound) {
		return "", ErrInvalidCredentials
	}
	if err != nil {
		return "", fmt.Errorf("auth: reading %s: %w", account, err)
	}
	// The password is checked before the status, so that ErrDisabled
	// reveals nothing to someone who does not know the password.
	key := sha256.Sum256([]byte(u.Address + "\x00" + password + "\x00" + u.PasswordHash))
	if !a.cached(key) {
		ok, err := a.checkHash(ctx, u.PasswordHash, password)
		if errors.Is(err, errBadHash) {
			a.log.Error("stored password hash unusable", "user", u.Address, "err", err)
			return "", ErrInvalidCredentials
		}
		if err != nil {
			return "", err
		}
		if !ok {
			return "", ErrInvalidCredentials
		}
		a.remember(key)
	}
	if u.Status == store.UserDisabled {
		return "", ErrDisabled
	}
	return u.Address, nil
}

// checkHash verifies password against a PHC hash within the KDF pool.
func (a *Authenticator) checkHash(ctx context.Context, hash, password string) (bool, error) {
	h, err := parseHash(hash)
	if err != nil {
		return false, err
	}
	release, err := a.kdf.acquire(ctx, h.p.MemoryKiB)
	if err != nil {
		return false, err
	}
	defer release()
	return h.verify(password), nil
}

func (a *Authenticator) cached(key [32]byte) bool {
	if a.opts.CacheTTL < 0 {
		return false
	}
	a.cacheMu.Lock()
	defer a.cacheMu.Unlock()
	exp, ok := a.cache[key]
	if ok && a.opts.Now().Before(exp) {
		return true
	}
	delete(a.cache, key)
	return false
}

func (a *Authenticator) remember(key [32]byte) {
	if a.opts.CacheTTL < 0 {
		return
	}
	now := a.opts.Now()
	a.cacheMu.Lock()
	defer a.cacheMu.Unlock()
	if len(a.cache) >= maxCacheEntries {
		for k, exp := range a.cache {
			if !now.Before(exp) {
				delete(a.cache, k)
			}
		}
		if len(a.cache) >= maxCacheEntries {
			clear(a.cache)
		}
	}
	a.cache[key] = now.Add(a.opts.CacheTTL)
}

// dummyHash is verified against when a login names no user.
var dummyHash = sync.OnceValue(func() string {
	h, err := HashPassword("quill-dummy", DefaultKDF)
	if err != nil {
		panic(err)
	}
	return h
})
