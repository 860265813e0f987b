package auth

import (
	"context"
	"sync"
	"time"
)

// throttle counts authentication attempts per key (a remote network, an
// account) in a sliding window. An attempt is reserved when it starts, in
// the same critical section as the check, so that concurrent attempts
// cannot all pass a check made before any of them is counted; what happens
// to the reservation afterwards is the caller's: fail settles it as a
// failure, cancel withdraws it (the attempt was not a failure).
//
// Invariant: at most limit attempts of a key are counted (failed or in
// progress) within the window. A key whose failures alone reach the limit
// is refused until the oldest leaves the window (refused attempts are not
// verified, so they are not counted). A key that is at the limit only
// because attempts are in progress makes a new attempt wait until one of
// them ends, rather than refusing it: concurrent logins from behind one
// address are legitimate, and waiting keeps the failures verified within
// the limit all the same. Memory is bounded: at most maxKeys keys are
// tracked, the stalest dropped first.
type throttle struct {
	limit   int
	window  time.Duration
	maxKeys int
	maxWait time.Duration // for an attempt in progress to end
	now     func() time.Time

	mu   sync.Mutex
	keys map[string]*failures
}

type failures struct {
	times   []time.Time // ascending, at most limit entries, failed or in progress
	pending int         // how many of times are in progress
	// ended, when not nil, is closed (and cleared) when an attempt in
	// progress ends; waiters for room hold it.
	ended chan struct{}
}

func newThrottle(limit int, window time.Duration, maxKeys int, now func() time.Time) *throttle {
	return &throttle{limit: limit, window: window, maxKeys: maxKeys, maxWait: 30 * time.Second, now: now, keys: map[string]*failures{}}
}

// reserve counts one attempt in progress for key if key is under its
// limit, waiting while the limit is reached only by attempts in progress;
// at identifies the reservation for fail and cancel. It returns
// ErrThrottled, or ctx's error. A throttle with no limit admits everything
// and counts nothing.
func (t *throttle) reserve(ctx context.Context, key string) (at time.Time, err error) {
	if t.limit <= 0 {
		return time.Time{}, nil
	}
	var timeout <-chan time.Time
	for {
		now := t.now()
		t.mu.Lock()
		f := t.keys[key]
		if f == nil {
			if len(t.keys) >= t.maxKeys {
				t.evictLocked(now)
			}
			f = &failures{}
			t.keys[key] = f
		}
		f.expire(now.Add(-t.window))
		if len(f.times) < t.limit {
			f.times = append(f.times, now)
			f.pending++
			t.mu.Unlock()
			return now, nil
		}
		if len(f.times)-f.pending >= t.limit {
			t.mu.Unlock()
			return time.Time{}, ErrThrottled
		}
		if f.ended == nil {
			f.ended = make(chan struct{})
		}
		ended := f.ended
		t.mu.Unlock()
		if timeout == nil {
			tm := time.NewTimer(t.maxWait)
			defer tm.Stop()
			timeout = tm.C
		}
		select {
		case <-ended:
		case <-timeout:
			return time.Time{}, ErrThrottled
		case <-ctx.Done():
			return time.Time{}, ctx.Err()
		}
	}
}

// fail settles a reservation of key as a failure: it stays counted.
func (t *throttle) fail(key string) {
	if t.limit <= 0 {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if f := t.keys[key]; f != nil {
		f.endLocked()
	}
}

// cancel withdraws one reservation made at at, leaving every other
// reservation and failure of key counted.
func (t *throttle) cancel(key string, at time.Time) {
	if t.limit <= 0 {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	f := t.keys[key]
	if f == nil {
		return
	}
	for i := len(f.times) - 1; i >= 0; i-- {
		if f.times[i].Equal(at) {
			f.times = append(f.times[:i], f.times[i+1:]...)
			break
		}
	}
	f.endLocked()
	if len(f.times) == 0 {
		delete(t.keys, key)
	}
}

// clear forgets everything counted for key.
func (t *throttle) clear(key string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if f := t.keys[key]; f != nil {
		f.wakeLocked()
		delete(t.keys, key)
	}
}

// evictLocked drops expired keys, and if none expired, the key whose last
// attempt is oldest.
func (t *throttle) evictLocked(now time.Time) {
	var oldestKey string
	var oldest time.Time
	for k, f := range t.keys {
		f.expire(now.Add(-t.window))
		if len(f.times) == 0 {
			f.wakeLocked()
			delete(t.keys, k)
			continue
		}
		if last := f.times[len(f.times)-1]; oldestKey == "" || last.Before(oldest) {
			oldestKey, oldest = k, last
		}
	}
	if len(t.keys) >= t.maxKeys && oldestKey != "" {
		t.keys[oldestKey].wakeLocked()
		delete(t.keys, oldestKey)
	}
}

// endLocked records that an attempt in progress ended and wakes waiters.
func (f *failures) endLocked() {
	f.pending = max(f.pending-1, 0)
	f.wakeLocked()
}

func (f *failures) wakeLocked() {
	if f.ended != nil {
		close(f.ended)
		f.ended = nil
	}
}

func (f *failures) expire(before time.Time) {
	i := 0
	for i < len(f.times) && f.times[i].Before(before) {
		i++
	}
	f.times = f.times[i:]
	// An attempt in progress for longer than the window no longer counts.
	f.pending = min(f.pending, len(f.times))
}
