package auth

import (
	"container/list"
	"context"
	"fmt"
	"sync"
	"time"
)

// kdfPool bounds the password-hash evaluations that run at once, by count
// and by memory, so that a flood of logins cannot exhaust a node: argon2id
// allocates its whole memory parameter (19 MiB by default) per evaluation,
// and unbounded, a few hundred simultaneous attempts took gigabytes.
//
// Invariant: the costs held add up to at most budget. An evaluation of a
// hash with memory m KiB costs min(budget, max(m, budget/slots)) KiB, so at
// most slots run at once, their memory stays within the budget, and a hash
// larger than the whole budget still runs, alone. Waiters are served in
// arrival order (a large request at the head is not starved by small ones);
// one waits at most wait, or until its ctx ends, and then gets ErrBusy (or
// the ctx's error). The live argon2 memory is thus bounded by the budget,
// and the garbage collector reuses freed blocks for the next evaluations.
//
// The garbage collector runs when the heap grows, not when the server goes
// quiet, so after a burst the freed argon2 memory would stay with the
// process until the next collection. When the pool goes idle after checks
// worth a whole budget, it calls onIdle (debug.FreeOSMemory in the server)
// in a goroutine, at most once per idleInterval.
type kdfPool struct {
	budget, unit int64 // KiB
	wait         time.Duration
	onIdle       func()
	idleInterval time.Duration
	now          func() time.Time

	mu       sync.Mutex
	used     int64
	waiters  list.List // of *kdfWaiter, in arrival order
	spent    int64     // KiB of checks since onIdle last ran
	lastIdle time.Time
}

type kdfWaiter struct {
	cost  int64
	ready chan struct{} // closed when the cost has been granted
}

func newKDFPool(budgetBytes int64, slots int, wait time.Duration) *kdfPool {
	budget := max(budgetBytes>>10, 1)
	return &kdfPool{budget: budget, unit: max(budget/int64(max(slots, 1)), 1), wait: wait,
		idleInterval: 10 * time.Second, now: time.Now}
}

// acquire waits for room for one evaluation of a hash with memory memKiB
// and returns the function that gives it back (to be called exactly once).
func (p *kdfPool) acquire(ctx context.Context, memKiB uint32) (release func(), err error) {
	cost := min(p.budget, max(int64(memKiB), p.unit))
	release = func() { p.release(cost) }
	p.mu.Lock()
	if p.waiters.Len() == 0 && p.used+cost <= p.budget {
		p.used += cost
		p.mu.Unlock()
		return release, nil
	}
	w := &kdfWaiter{cost: cost, ready: make(chan struct{})}
	elem := p.waiters.PushBack(w)
	p.mu.Unlock()

	t := time.NewTimer(p.wait)
	defer t.Stop()
	select {
	case <-w.ready:
		return release, nil
	case <-t.C:
		err = ErrBusy
	case <-ctx.Done():
		err = fmt.Errorf("auth: waiting for the KDF: %w", ctx.Err())
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	select {
	case <-w.ready:
		// Granted as the wait ended: the room is ours, so use it.
		return release, nil
	default:
	}
	front := p.waiters.Front() == elem
	p.waiters.Remove(elem)
	if front {
		// The head may have been blocking smaller requests behind it.
		p.grantLocked()
	}
	return nil, err
}

// load returns the budget held (bytes) and the number of waiters.
func (p *kdfPool) load() (usedBytes int64, waiting int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.used << 10, p.waiters.Len()
}

func (p *kdfPool) release(cost int64) {
	p.mu.Lock()
	p.used -= cost
	p.spent += cost
	p.grantLocked()
	var idle func()
	if p.onIdle != nil && p.used == 0 && p.spent >= p.budget {
		if now := p.now(); now.Sub(p.lastIdle) >= p.idleInterval {
			p.spent, p.lastIdle, idle = 0, now, p.onIdle
		}
	}
	p.mu.Unlock()
	if idle != nil {
		go idle()
	}
}

// grantLocked admits waiters from the head while they fit.
func (p *kdfPool) grantLocked() {
	for e := p.waiters.Front(); e != nil; e = p.waiters.Front() {
		w := e.Value.(*kdfWaiter)
		if p.used+w.cost > p.budget {
			return
		}
		p.used += w.cost
		p.waiters.Remove(e)
		close(w.ready)
	}
}
