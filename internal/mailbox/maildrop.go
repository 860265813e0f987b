// Package mailbox implements mailbox semantics over the store: the POP3
// maildrop view with its exclusive lock, and (with IMAP) selected-mailbox
// state, change events and quotas.
package mailbox

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strconv"
	"sync"
	"time"

	"quill/internal/store"
)

// Store is what mailbox semantics need from the store.
type Store interface {
	GetMailbox(ctx context.Context, user, name string) (store.Mailbox, error)
	ListMessages(ctx context.Context, mailbox store.ID, from uint32, limit int) ([]store.Message, error)
	OpenBlob(ctx context.Context, id store.ID) (store.BlobReader, error)
	Expunge(ctx context.Context, mailbox store.ID, uids []uint32) ([]uint32, uint64, error)
	// The maildrop lock is the store's, so that it holds across every
	// process sharing the store.
	store.MaildropLocker
}

// Service hands out maildrops. It is safe for concurrent use.
type Service struct {
	st Store
}

// NewService returns a Service over st.
func NewService(st Store) *Service {
	return &Service{st: st}
}

// releaseTimeout bounds the release of a maildrop's lease when the session
// ends without a context (Close): a release that fails leaves the lease to
// expire (store.MaildropLease).
const releaseTimeout = 10 * time.Second

// MaxMaildrop bounds the messages one POP3 session lists; a larger INBOX
// shows its oldest MaxMaildrop messages (clients see the rest once these
// are deleted), which keeps a session's memory bounded.
const MaxMaildrop = 100_000

// Maildrop is one POP3 session's exclusive view of a user's INBOX, fixed
// when opened (RFC 1939 section 8: the maildrop is locked for the session;
// message numbers do not change).
//
// The lock is the store's maildrop lease (store.MaildropLocker), so it is
// exclusive among the sessions of every process sharing the store.
type Maildrop struct {
	s        *Service
	lease    store.MaildropLease
	user     string
	mailbox  store.Mailbox
	messages []store.Message
	once     sync.Once
}

// OpenMaildrop locks user's INBOX and snapshots its messages. It returns
// ErrInUse if another session holds the lock.
func (s *Service) OpenMaildrop(ctx context.Context, user string) (*Maildrop, error) {
	lease, err := s.st.LockMaildrop(ctx, user)
	if errors.Is(err, store.ErrInUse) {
		return nil, fmt.Errorf("%w: %w", ErrInUse, err)
	}
	if err != nil {
		return nil, fmt.Errorf("mailbox: locking the maildrop of %s: %w", user, err)
	}
	m := &Maildrop{s: s, lease: lease, user: user}
	if err := m.load(ctx); err != nil {
		m.unlock(ctx)
		return nil, err
	}
	return m, nil
}

func (m *Maildrop) load(ctx context.Context) error {
	inbox, err := m.s.st.GetMailbox(ctx, m.user, "INBOX")
	if err != nil {
		return fmt.Errorf("mailbox: INBOX of %s: %w", m.user, err)
	}
	m.mailbox = inbox
	var from uint32 = 1
	for len(m.messages) < MaxMaildrop {
		page, err := m.s.st.ListMessages(ctx, inbox.ID, from, min(1000, MaxMaildrop-len(m.messages)))
		if err != nil {
			return fmt.Errorf("mailbox: listing INBOX of %s: %w", m.user, err)
		}
		m.messages = append(m.messages, page...)
		if len(page) < 1000 {
			break
		}
		from = page[len(page)-1].UID + 1
	}
	return nil
}

// Len is the number of messages in the maildrop.
func (m *Maildrop) Len() int { return len(m.messages) }

// Size returns the size in octets of message i (0-based).
func (m *Maildrop) Size(i int) int64 { return m.messages[i].Size }

// UniqueID returns the RFC 1939 unique-id of message i: UIDVALIDITY.UID,
// stable across sessions and never reused for another message.
func (m *Maildrop) UniqueID(i int) string {
	return strconv.FormatUint(uint64(m.mailbox.UIDValidity), 10) + "." + strconv.FormatUint(uint64(m.messages[i].UID), 10)
}

// Open returns the stored bytes of message i.
func (m *Maildrop) Open(ctx context.Context, i int) (io.ReadCloser, error) {
	r, err := m.s.st.OpenBlob(ctx, m.messages[i].Blob)
	if errors.Is(err, store.ErrNotFound) {
		// Expunged meanwhile through IMAP.
		return nil, fmt.Errorf("mailbox: message %d is gone: %w", i+1, err)
	}
	return r, err
}

// Commit expunges the messages with the given indexes atomically and
// releases the lock (RFC 1939 UPDATE state). Messages already expunged by
// another protocol are ignored. It expunges nothing, and fails, once the
// lease may have passed to another session (store.ErrLeaseLost).
func (m *Maildrop) Commit(ctx context.Context, deleted []int) error {
	defer m.unlock(ctx)
	if len(deleted) == 0 {
		return nil
	}
	if err := m.lease.Held(); err != nil {
		return fmt.Errorf("mailbox: expunging for %s: %w", m.user, err)
	}
	uids := make([]uint32, 0, len(deleted))
	for _, i := range deleted {
		uids = append(uids, m.messages[i].UID)
	}
	if _, _, err := m.s.st.Expunge(ctx, m.mailbox.ID, uids); err != nil {
		return fmt.Errorf("mailbox: expunging for %s: %w", m.user, err)
	}
	return nil
}

// Close releases the lock without changes.
func (m *Maildrop) Close() error {
	ctx, cancel := context.WithTimeout(context.Background(), releaseTimeout)
	defer cancel()
	return m.unlock(ctx)
}

// unlock releases the lease once. Its error is only worth logging: the
// lease then expires by itself.
func (m *Maildrop) unlock(ctx context.Context) error {
	var err error
	m.once.Do(func() {
		err = m.lease.Release(context.WithoutCancel(ctx))
		if err != nil {
			err = fmt.Errorf("mailbox: unlocking the maildrop of %s: %w", m.user, err)
		}
	})
	return err
}
