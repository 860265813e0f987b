package cassandra

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	gocql "github.com/apache/cassandra-gocql-driver/v2"

	"quill/internal/store"
)

var _ store.MaildropLocker = (*Engine)(nil)

// LockMaildrop implements store.MaildropLocker with a row per maildrop in
// maildrop_leases, shared by every process on the keyspace:
//
//   - taking it is one LWT, INSERT ... IF NOT EXISTS USING TTL (the lease
//     term, Options.MaildropLease), owned by a fresh random ID;
//   - the holder renews it every third of the term with an LWT that
//     rewrites the row with a new TTL IF the owner is still its ID;
//   - Release deletes it IF the owner is still its ID.
//
// A holder whose process dies stops renewing, and its lease expires at most
// one term after its last renewal. A holder that cannot renew for a whole
// term (Cassandra unreachable) may have lost the lease: Held then fails, so
// the session does not expunge while another may hold the maildrop. The
// term is measured from before each LWT is sent, so the holder's view of
// its lease ends no later than the row's TTL, clocks agreeing.
func (e *Engine) LockMaildrop(ctx context.Context, user string) (store.MaildropLease, error) {
	l := &lease{e: e, user: user, owner: store.NewID(), stop: make(chan struct{}), done: make(chan struct{})}
	sent := time.Now()
	applied, err := e.cas(ctx, `INSERT INTO maildrop_leases (address, owner) VALUES (?, ?) IF NOT EXISTS USING TTL ?`,
		user, l.owner[:], e.leaseTTL()).MapScanCAS(map[string]any{})
	if err != nil {
		// The outcome is unknown: a serial read completes any Paxos round
		// in progress, so the row it returns says whether ours won.
		applied, err = l.owned(ctx, err)
	}
	if err != nil {
		return nil, err
	}
	if !applied {
		return nil, fmt.Errorf("maildrop of %s: %w", user, store.ErrInUse)
	}
	l.mu.until = sent.Add(e.opts.MaildropLease)
	go l.renewLoop()
	return l, nil
}

// leaseTTL is the lease term in whole seconds, as CQL's TTL takes it.
func (e *Engine) leaseTTL() int {
	return int((e.opts.MaildropLease + time.Second - 1) / time.Second)
}

// lease is one held maildrop_leases row.
type lease struct {
	e     *Engine
	user  string
	owner store.ID

	mu struct {
		sync.Mutex
		until time.Time // the lease is held before this instant; zero once lost
	}
	stop chan struct{} // closed by Release
	done chan struct{} // closed when renewLoop returns
	once sync.Once
}

// owned resolves a lease LWT that failed with cause: it reports whether
// the row is ours after the round, serially read.
func (l *lease) owned(ctx context.Context, cause error) (bool, error) {
	var owner []byte
	err := l.e.serialRead(ctx, `SELECT owner FROM maildrop_leases WHERE address = ?`, l.user).Scan(&owner)
	if errors.Is(err, gocql.ErrNotFound) {
		return false, wrap("taking maildrop lease", cause)
	}
	if err != nil {
		return false, wrap("taking maildrop lease", fmt.Errorf("%w (then reading it: %w)", cause, err))
	}
	return bytes.Equal(owner, l.owner[:]), nil
}

// Held implements store.MaildropLease.
func (l *lease) Held() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !time.Now().Before(l.mu.until) {
		return fmt.Errorf("maildrop of %s: not renewed within its term: %w", l.user, store.ErrLeaseLost)
	}
	return nil
}

// renewLoop renews the lease every third of its term until Release, the
// engine's Close, or a renewal that finds the row no longer ours. A
// failed renewal is retried at the next tick: two may fail before the
// term runs out.
func (l *lease) renewLoop() {
	defer close(l.done)
	tick := time.NewTicker(l.e.opts.MaildropLease / 3)
	defer tick.Stop()
	for {
		select {
		case <-l.stop:
			return
		case <-l.e.stop:
			return
		case <-tick.C:
		}
		ctx, cancel := context.WithTimeout(context.Background(), l.e.opts.MaildropLease/3)
		sent := time.Now()
		applied, err := l.e.cas(ctx, `UPDATE maildrop_leases USING TTL ? SET owner = ? WHERE address = ? IF owner = ?`,
			l.e.leaseTTL(), l.owner[:], l.user, l.owner[:]).MapScanCAS(map[string]any{})
		renewed := err == nil && applied
		if err != nil {
			// Still ours says nothing of whether the TTL was renewed: the
			// term keeps its previous end.
			applied, err = l.owned(ctx, err)
		}
		cancel()
		switch {
		case renewed:
			l.mu.Lock()
			l.mu.until = sent.Add(l.e.opts.MaildropLease)
			l.mu.Unlock()
		case err != nil || applied:
			l.e.log.Warn("renewing maildrop lease", "user", l.user, "err", err)
		default:
			l.e.log.Warn("maildrop lease lost: expired before its renewal", "user", l.user)
			l.mu.Lock()
			l.mu.until = time.Time{}
			l.mu.Unlock()
			return
		}
	}
}

// Release implements store.MaildropLease.
func (l *lease) Release(ctx context.Context) error {
	var err error
	l.once.Do(func() {
		close(l.stop)
		<-l.done
		l.mu.Lock()
		l.mu.until = time.Time{}
		l.mu.Unlock()
		_, err = l.e.cas(ctx, `DELETE FROM maildrop_leases WHERE address = ? IF owner = ?`, l.user, l.owner[:]).MapScanCAS(map[string]any{})
		err = wrap("releasing maildrop lease", err)
	})
	return err
}
