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

	"quill/internal/store"
)

// Store is what mailbox semantics need from the store.
type Store interface {
	GetMailbox(ctx context.Context, user, name string) (store.Mailbox, error)
	ListMessages(ctx context.Context, mailbox store.ID, from uint32, limit int) ([]store.Message, error)
	OpenBlob(ctx context.Context, id store.ID) (store.BlobReader, error)
	Expunge(ctx context.Context, mailbox store.ID, uids []uint32) ([]uint32, uint64, error)
}

// Service hands out maildrops. It is safe for concurrent use.
type Service struct {
	st Store

	mu     sync.Mutex
	locked map[string]bool // users whose maildrop a POP3 session holds
}

// NewService returns a Service over st.
func NewService(st Store) *Service {
	return &Service{st: st, locked: map[string]bool{}}
}

// MaxMaildrop bounds the messages one POP3 session lists; a larger INBOX
// shows its oldest MaxMaildrop messages (clients see the rest once these
// are deleted), which keeps a session's memory bounded.
const MaxMaildrop = 100_000

// Maildrop is one POP3 session's exclusive view of a user's INBOX, fixed
// when opened (RFC 1939 section 8: the maildrop is locked for the session;
// message numbers do not change).
//
// The lock is held by this process only. With several nodes (the cluster
// issue) it moves to the user's manager node.
type Maildrop struct {
	s        *Service
	user     string
	mailbox  store.Mailbox
	messages []store.Message
	once     sync.Once
}

// OpenMaildrop locks user's INBOX and snapshots its messages. It returns
// ErrInUse if another session holds the lock.
func (s *Service) OpenMaildrop(ctx context.Context, user string) (*Maildrop, error) {
	s.mu.Lock()
	if s.locked[user] {
		s.mu.Unlock()
		return nil, ErrInUse
	}
	s.locked[user] = true
	s.mu.Unlock()
	m := &Maildrop{s: s, user: user}
	if err := m.load(ctx); err != nil {
		m.unlock()
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
// another protocol are ignored.
func (m *Maildrop) Commit(ctx context.Context, deleted []int) error {
	defer m.unlock()
	if len(deleted) == 0 {
		return nil
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
	m.unlock()
	return nil
}

func (m *Maildrop) unlock() {
	m.once.Do(func() {
		m.s.mu.Lock()
		delete(m.s.locked, m.user)
		m.s.mu.Unlock()
	})
}
