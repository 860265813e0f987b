package main

import (
	"context"
	"crypto/subtle"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"slices"
	"strconv"
	"sync"

	"quill/internal/auth"
	"quill/internal/mail"
	"quill/internal/mailbox"
	"quill/internal/pop3"
)

// maildrops is the mail floor's index over the durable log: for each user,
// the messages delivered and not expunged, in log order, and the POP3
// lock. It is memory only and rebuilt from the log on open (replay), so the
// log stays the one durable structure: a message enters the index only
// once its record is synced, and leaves it only once an expunge record
// naming it is.
//
// It serves POP3 (pop3.Backend) with one password for every user: the
// floor measures the cost of storing and retrieving mail, and a password
// hash is a policy cost that the benchmark's servers pay alike and the
// floor leaves out.
type maildrops struct {
	log      *durableLog // set once opened; replay runs before
	domains  []string
	password []byte

	mu    sync.Mutex
	boxes map[string]*maildrop // by normalized address
}

// maildrop is one user's index entry.
type maildrop struct {
	msgs   []msgLoc // ascending rec: log order
	locked bool     // a POP3 session holds it
}

var _ pop3.Backend = (*maildrops)(nil)

func newMaildrops(domains []string, password string) *maildrops {
	return &maildrops{domains: domains, password: []byte(password), boxes: make(map[string]*maildrop)}
}

// box returns user's entry, creating it. mu is held.
func (m *maildrops) box(user string) *maildrop {
	b := m.boxes[user]
	if b == nil {
		b = &maildrop{}
		m.boxes[user] = b
	}
	return b
}

// delivered adds the message at loc to each user's maildrop.
func (m *maildrops) delivered(users []string, loc msgLoc) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, u := range users {
		b := m.box(u)
		// Concurrent deliveries finish their syncs in any order; keep log
		// order so that a replay lists the same sequence.
		i := len(b.msgs)
		for i > 0 && b.msgs[i-1].rec > loc.rec {
			i--
		}
		b.msgs = slices.Insert(b.msgs, i, loc)
	}
}

// expunged removes the messages recs from user's maildrop; recs not in it
// are ignored.
func (m *maildrops) expunged(user string, recs []int64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	b := m.boxes[user]
	if b == nil {
		return
	}
	gone := make(map[int64]bool, len(recs))
	for _, r := range recs {
		gone[r] = true
	}
	b.msgs = slices.DeleteFunc(b.msgs, func(l msgLoc) bool { return gone[l.rec] })
}

// replay applies one record of the log to the index (a replayFunc).
func (m *maildrops) replay(off int64, payload []byte) error {
	if len(payload) == 0 {
		return errors.New("empty payload")
	}
	r := payloadReader{b: payload[1:]}
	switch payload[0] {
	case kindMessage:
		users := make([]string, r.count())
		for i := range users {
			users[i] = r.string()
		}
		if r.err != nil {
			return r.err
		}
		head := int64(len(payload) - len(r.b))
		m.delivered(users, msgLoc{rec: off, body: off + recordHeaderLen + head, size: int64(len(r.b))})
	case kindExpunge:
		user := r.string()
		recs := make([]int64, r.count())
		for i := range recs {
			recs[i] = int64(r.uvarint())
		}
		if r.err == nil && len(r.b) != 0 {
			r.err = errors.New("trailing octets after an expunge")
		}
		if r.err != nil {
			return r.err
		}
		m.expunged(user, recs)
	default:
		return fmt.Errorf("unknown payload kind %q", payload[0])
	}
	return nil
}

// payloadReader decodes a payload's fields; the first error sticks.
type payloadReader struct {
	b   []byte
	err error
}

func (r *payloadReader) uvarint() uint64 {
	if r.err != nil {
		return 0
	}
	v, n := binary.Uvarint(r.b)
	if n <= 0 {
		r.err = errors.New("malformed payload")
		return 0
	}
	r.b = r.b[n:]
	return v
}

// count reads a count or a length: each counted item takes at least one
// octet, so none can exceed the octets left. This also bounds what a
// corrupt (but checksummed) record could make replay allocate.
func (r *payloadReader) count() int {
	v := r.uvarint()
	if v > uint64(len(r.b)) {
		r.err = errors.New("malformed payload")
		return 0
	}
	return int(v)
}

func (r *payloadReader) string() string {
	n := r.count()
	if r.err != nil {
		r.err = errors.New("malformed payload")
		return ""
	}
	s := string(r.b[:n])
	r.b = r.b[n:]
	return s
}

// Authenticate accepts any address in the floor's domains with the floor's
// password.
func (m *maildrops) Authenticate(_ context.Context, username, password string, _ netip.Addr) (string, error) {
	a, err := mail.ParseAddress(username, true)
	if err != nil || !slices.Contains(m.domains, a.DomainNormalized()) || subtle.ConstantTimeCompare([]byte(password), m.password) != 1 {
		return "", auth.ErrInvalidCredentials
	}
	return a.Normalized(), nil
}

// OpenMaildrop locks user's maildrop and lists it as it is now.
func (m *maildrops) OpenMaildrop(_ context.Context, user string) (pop3.Maildrop, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	b := m.box(user)
	if b.locked {
		return nil, mailbox.ErrInUse
	}
	b.locked = true
	s := &session{m: m, user: user, box: b, locs: slices.Clone(b.msgs)}
	s.list = make([]pop3.Message, len(s.locs))
	for i, l := range s.locs {
		s.list[i] = pop3.Message{UID: strconv.FormatInt(l.rec, 10), Size: l.size}
	}
	return s, nil
}

// session is one POP3 session's locked view of a maildrop (pop3.Maildrop).
type session struct {
	m    *maildrops
	user string
	box  *maildrop
	locs []msgLoc
	list []pop3.Message
	done bool // unlocked
}

func (s *session) Messages() []pop3.Message { return s.list }

// Retrieve reads the message from the log: it is below the synced end,
// and the log is never rewritten.
func (s *session) Retrieve(_ context.Context, i int) (io.ReadCloser, error) {
	l := s.locs[i]
	return io.NopCloser(io.NewSectionReader(s.m.log.f, l.body, l.size)), nil
}

// Commit makes the expunge durable before it changes the index, so a DELE
// that QUIT acknowledged survives a crash; the lock goes either way.
func (s *session) Commit(ctx context.Context, deleted []int) error {
	defer s.Close()
	if len(deleted) == 0 {
		return nil
	}
	recs := make([]int64, len(deleted))
	for i, d := range deleted {
		recs[i] = s.locs[d].rec
	}
	if err := s.m.log.Expunge(ctx, s.user, recs); err != nil {
		return err
	}
	s.m.expunged(s.user, recs)
	return nil
}

// Close unlocks the maildrop; it may be called more than once.
func (s *session) Close() error {
	s.m.mu.Lock()
	defer s.m.mu.Unlock()
	if !s.done {
		s.done = true
		s.box.locked = false
	}
	return nil
}
