package mailbox

import (
	"sync"

	"quill/internal/store"
)

// Hub fans change notifications out to the sessions that have a mailbox
// selected in this process, so that IDLE (RFC 2177) wakes as soon as a
// delivery, an APPEND or another session's STORE/EXPUNGE commits.
//
// A notification carries no data: it only says "the change log of this
// mailbox has grown"; the woken view reads the log itself (View.Poll).
// Notifications coalesce: a subscriber that has not yet consumed one gets
// no second. That makes Notify non-blocking and lossless for the only
// question subscribers ask. The user manager (internal/usermgr) calls
// Notify after every durable write; with a cluster, notifications from a
// user's manager node will arrive here through the same Notify.
//
// It is safe for concurrent use. The zero value is not usable; NewHub.
type Hub struct {
	mu   sync.Mutex
	subs map[store.ID]map[chan struct{}]struct{}
	// watcher, if set, hears each mailbox gain its first subscriber and
	// lose its last (under mu, so in that order).
	watcher Watcher
	// recent is, per mailbox, the highest UID some session of this process
	// has claimed as \Recent (RFC 3501 section 2.3.2): each message is
	// \Recent in exactly one session. It is process memory (one entry per
	// mailbox ever selected read-write): after a restart, the first session
	// sees every message as \Recent. IMAP4rev2 dropped \Recent, and rev1
	// clients use it only as a hint.
	recent map[store.ID]uint32
}

// NewHub returns an empty Hub.
func NewHub() *Hub {
	return &Hub{subs: map[store.ID]map[chan struct{}]struct{}{}, recent: map[store.ID]uint32{}}
}

// Watcher hears which mailboxes have sessions in this process: the
// cluster's fan-out of change events (internal/cluster/events), which
// sends a node's events only to the nodes that watch them. Its methods
// must not block.
type Watcher interface {
	Watch(mailbox store.ID)
	Unwatch(mailbox store.ID)
}

// Observe makes w hear every mailbox that has a subscriber now (Watch), and
// from then on each one that gains its first (Watch) or loses its last
// (Unwatch).
func (h *Hub) Observe(w Watcher) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.watcher = w
	for id := range h.subs {
		w.Watch(id)
	}
}

// Subscribe returns a channel that receives a value after each change to
// mailbox, and a cancel function that must be called when done.
func (h *Hub) Subscribe(mailbox store.ID) (<-chan struct{}, func()) {
	ch := make(chan struct{}, 1)
	h.mu.Lock()
	m := h.subs[mailbox]
	if m == nil {
		m = map[chan struct{}]struct{}{}
		h.subs[mailbox] = m
		if h.watcher != nil {
			h.watcher.Watch(mailbox)
		}
	}
	m[ch] = struct{}{}
	h.mu.Unlock()
	var once sync.Once
	return ch, func() {
		once.Do(func() {
			h.mu.Lock()
			defer h.mu.Unlock()
			delete(h.subs[mailbox], ch)
			if len(h.subs[mailbox]) == 0 {
				delete(h.subs, mailbox)
				if h.watcher != nil {
					h.watcher.Unwatch(mailbox)
				}
			}
		})
	}
}

// Notify tells every subscriber of mailbox that its change log grew. It
// never blocks.
func (h *Hub) Notify(mailbox store.ID) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for ch := range h.subs[mailbox] {
		select {
		case ch <- struct{}{}:
		default:
		}
	}
}

// claimRecent claims for the caller every UID below uidNext that no
// session has claimed yet and returns the first UID claimed (the caller's
// \Recent messages are those from it up to uidNext-1).
func (h *Hub) claimRecent(mailbox store.ID, uidNext uint32) uint32 {
	h.mu.Lock()
	defer h.mu.Unlock()
	first := h.recent[mailbox] + 1
	if uidNext > first {
		h.recent[mailbox] = uidNext - 1
	}
	return first
}
