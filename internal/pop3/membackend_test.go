package pop3

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"quill/internal/auth"
	"quill/internal/mailbox"
)

// memBackend is an in-memory Backend with real maildrop locking, for
// protocol tests. Special user names make Authenticate fail: "throttled",
// "disabled", "broken" (a temporary failure) and "panic".
type memBackend struct {
	mu    sync.Mutex
	users map[string]string // user -> password
	boxes map[string]*memBox
}

type memBox struct {
	msgs       []memMessage
	locked     bool
	unlocked   chan struct{} // closed when the lock is released
	failCommit bool
	commits    int
	closes     int
}

type memMessage struct {
	uid  string
	body string
	// failAt, if positive, makes Retrieve's reader fail after this many
	// octets.
	failAt int
}

var _ Backend = (*memBackend)(nil)

func newMemBackend() *memBackend {
	return &memBackend{users: make(map[string]string), boxes: make(map[string]*memBox)}
}

func (b *memBackend) addUser(user, password string, msgs ...memMessage) *memBox {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.users[user] = password
	box := &memBox{msgs: msgs}
	b.boxes[user] = box
	return box
}

func (b *memBackend) Authenticate(ctx context.Context, username, password string, remote netip.Addr) (string, error) {
	switch username {
	case "throttled":
		return "", auth.ErrThrottled
	case "disabled":
		return "", auth.ErrDisabled
	case "broken":
		return "", errors.New("memBackend: directory unavailable")
	case "panic":
		panic("memBackend: panic requested")
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if pw, ok := b.users[username]; !ok || pw != password {
		return "", auth.ErrInvalidCredentials
	}
	return username, nil
}

func (b *memBackend) OpenMaildrop(ctx context.Context, user string) (Maildrop, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	box := b.boxes[user]
	if box.locked {
		return nil, mailbox.ErrInUse
	}
	box.locked = true
	box.unlocked = make(chan struct{})
	return &memDrop{b: b, box: box, msgs: append([]memMessage(nil), box.msgs...)}, nil
}

// waitUnlocked blocks until user's maildrop is not locked.
func (b *memBackend) waitUnlocked(t testing.TB, user string) {
	t.Helper()
	b.mu.Lock()
	box := b.boxes[user]
	ch := box.unlocked
	locked := box.locked
	b.mu.Unlock()
	if !locked {
		return
	}
	select {
	case <-ch:
	case <-time.After(10 * time.Second):
		t.Fatalf("maildrop of %s still locked", user)
	}
}

// state returns the UIDs in user's maildrop and its commit and close
// counts.
func (b *memBackend) state(user string) (uids []string, commits, closes int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	box := b.boxes[user]
	for _, m := range box.msgs {
		uids = append(uids, m.uid)
	}
	return uids, box.commits, box.closes
}

type memDrop struct {
	b    *memBackend
	box  *memBox
	msgs []memMessage
	done bool
}

var _ Maildrop = (*memDrop)(nil)

func (d *memDrop) Messages() []Message {
	out := make([]Message, len(d.msgs))
	for i, m := range d.msgs {
		out[i] = Message{UID: m.uid, Size: int64(len(m.body))}
	}
	return out
}

func (d *memDrop) Retrieve(ctx context.Context, i int) (io.ReadCloser, error) {
	if d.done {
		return nil, errors.New("memDrop: used after unlock")
	}
	m := d.msgs[i]
	var r io.Reader = strings.NewReader(m.body)
	if m.failAt > 0 {
		r = io.MultiReader(strings.NewReader(m.body[:m.failAt]), failingReader{})
	}
	return io.NopCloser(r), nil
}

type failingReader struct{}

func (failingReader) Read([]byte) (int, error) { return 0, errors.New("memDrop: blob read failed") }

func (d *memDrop) Commit(ctx context.Context, deleted []int) error {
	d.b.mu.Lock()
	defer d.b.mu.Unlock()
	if d.done {
		return errors.New("memDrop: Commit after unlock")
	}
	d.done = true
	defer d.unlockLocked()
	d.box.commits++
	if d.box.failCommit {
		return fmt.Errorf("memDrop: commit: %w", errors.New("disk full"))
	}
	gone := make(map[string]bool)
	for _, i := range deleted {
		gone[d.msgs[i].uid] = true
	}
	kept := d.box.msgs[:0]
	for _, m := range d.box.msgs {
		if !gone[m.uid] {
			kept = append(kept, m)
		}
	}
	d.box.msgs = kept
	return nil
}

func (d *memDrop) Close() error {
	d.b.mu.Lock()
	defer d.b.mu.Unlock()
	if d.done {
		return errors.New("memDrop: Close after unlock")
	}
	d.done = true
	d.box.closes++
	d.unlockLocked()
	return nil
}

func (d *memDrop) unlockLocked() {
	d.box.locked = false
	close(d.box.unlocked)
}
