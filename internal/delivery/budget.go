package delivery

import (
	"container/list"
	"errors"
	"io"
	"sync"
	"time"
)

// ErrBusy is returned, wrapped, when a message body cannot be received
// now because the bodies in flight hold the whole Budget: temporary
// (SMTP 451 4.3.1, IMAP NO [UNAVAILABLE]).
var ErrBusy = errors.New("delivery: too many message bodies in flight, try again later")

// Budget bounds the octets of message bodies in flight on a node: read
// from a client and not yet durable. Below the receiving front end a body
// passes through buffers, store transactions and the engine's memtables,
// and with many large bodies at once those held most of the process's
// memory. A body that would exceed the Budget waits (its client's TCP
// window closes meanwhile), and fails with ErrBusy if no room is made
// within the wait.
//
// Invariant: the oldest body in flight (the Hold that began holding first
// among those holding octets) is never made to wait, so some body always
// progresses and waiting cannot deadlock, whatever the sizes; the octets
// held may therefore exceed the limit by at most the oldest body's size.
//
// A nil *Budget bounds nothing. It is safe for concurrent use.
type Budget struct {
	limit int64
	wait  time.Duration

	mu struct {
		sync.Mutex
		used  int64
		order list.List     // of *Hold holding octets, oldest first
		room  chan struct{} // closed and replaced when octets are released
	}
}

// NewBudget returns a Budget of limit octets; a body that finds it full
// waits up to wait for room.
func NewBudget(limit int64, wait time.Duration) *Budget {
	b := &Budget{limit: limit, wait: wait}
	b.mu.room = make(chan struct{})
	return b
}

// Hold is one body's share of a Budget. It is used by one goroutine.
type Hold struct {
	b    *Budget
	held int64
	elem *list.Element // in b.mu.order while held > 0
}

// Hold returns an empty share of b for one body.
func (b *Budget) Hold() *Hold { return &Hold{b: b} }

// Reader returns r, each octet of which is charged to h as it is read.
func (h *Hold) Reader(r io.Reader) io.Reader {
	if h.b == nil {
		return r
	}
	return &heldReader{r: r, h: h}
}

type heldReader struct {
	r   io.Reader
	h   *Hold
	err error
}

func (hr *heldReader) Read(p []byte) (int, error) {
	if hr.err != nil {
		return 0, hr.err
	}
	n, err := hr.r.Read(p)
	if n > 0 {
		if berr := hr.h.take(int64(n)); berr != nil {
			hr.err = berr
			return 0, berr
		}
	}
	return n, err
}

// take charges n octets, waiting for room while the budget is full and h
// is not the oldest body in flight.
func (h *Hold) take(n int64) error {
	b := h.b
	var timer *time.Timer
	defer func() {
		if timer != nil {
			timer.Stop()
		}
	}()
	b.mu.Lock()
	for {
		oldest := b.mu.order.Len() == 0 || b.mu.order.Front() == h.elem
		if oldest || b.mu.used+n <= b.limit {
			if h.elem == nil {
				h.elem = b.mu.order.PushBack(h)
			}
			h.held += n
			b.mu.used += n
			b.mu.Unlock()
			return nil
		}
		if timer == nil {
			timer = time.NewTimer(b.wait)
		}
		room := b.mu.room
		b.mu.Unlock()
		select {
		case <-room:
		case <-timer.C:
			return ErrBusy
		}
		b.mu.Lock()
	}
}

// Release returns everything h holds; call it once the body is durable or
// abandoned. h may be used again afterwards.
func (h *Hold) Release() {
	b := h.b
	if b == nil || h.elem == nil {
		return
	}
	b.mu.Lock()
	b.mu.used -= h.held
	b.mu.order.Remove(h.elem)
	h.held, h.elem = 0, nil
	close(b.mu.room)
	b.mu.room = make(chan struct{})
	b.mu.Unlock()
}
