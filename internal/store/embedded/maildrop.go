package embedded

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"

	"quill/internal/store"
)

// maildropLocks are the POP3 maildrop leases of an embedded store. Only
// one process opens the store's directory, so an in-process lock is
// exclusive among all sessions, and a lease never expires: the process
// holding it is the only one that could want it.
type maildropLocks struct {
	mu   sync.Mutex
	held map[string]bool // users whose maildrop is leased
}

// LockMaildrop implements store.MaildropLocker.
func (e *Engine) LockMaildrop(ctx context.Context, user string) (store.MaildropLease, error) {
	l := &e.drops
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.held[user] {
		return nil, fmt.Errorf("maildrop of %s: %w", user, store.ErrInUse)
	}
	if l.held == nil {
		l.held = map[string]bool{}
	}
	l.held[user] = true
	return &localLease{locks: l, user: user}, nil
}

// localLease is a held maildropLocks entry.
type localLease struct {
	locks    *maildropLocks
	user     string
	once     sync.Once
	released atomic.Bool
}

// Held implements store.MaildropLease: a local lease is held until Release.
func (l *localLease) Held() error {
	if l.released.Load() {
		return fmt.Errorf("maildrop of %s: released: %w", l.user, store.ErrLeaseLost)
	}
	return nil
}

// Release implements store.MaildropLease.
func (l *localLease) Release(context.Context) error {
	l.once.Do(func() {
		l.released.Store(true)
		l.locks.mu.Lock()
		delete(l.locks.held, l.user)
		l.locks.mu.Unlock()
	})
	return nil
}
