package auth

import (
	"sync"
	"time"
)

// throttle counts authentication attempts per key (a remote network, an
// account) in a sliding window. An attempt is reserved when it starts, in
// the same critical section as the check, so that concurrent attempts
// cannot all pass a check made before any of them is counted; what happens
// to the reservation afterwards is the caller's: a failure keeps it, an
// attempt that was not a failure cancels it. A key with limit reservations
// inside the window is refused until the oldest leaves the window (refused
// attempts are not verified, so they are not counted). Memory is bounded:
// at most maxKeys keys are tracked, the stalest dropped first.
type throttle struct {
	limit   int
	window  time.Duration
	maxKeys int
	now     func() time.Time

	mu   sync.Mutex
	keys map[string]*failures
}

type failures struct {
	times []time.Time // ascending, at most limit entries
}

func newThrottle(limit int, window time.Duration, maxKeys int, now func() time.Time) *throttle {
	return &throttle{limit: limit, window: window, maxKeys: maxKeys, now: now, keys: map[string]*failures{}}
}

// reserve counts one attempt for key if key is under its limit and reports
// whether it did; at identifies the reservation for cancel. A throttle
// with no limit admits everything and counts nothing.
func (t *throttle) reserve(key string) (at time.Time, ok bool) {
	if t.limit <= 0 {
		return time.Time{}, true
	}
	now := t.now()
	t.mu.Lock()
	defer t.mu.Unlock()
	f := t.keys[key]
	if f == nil {
		if len(t.keys) >= t.maxKeys {
			t.evictLocked(now)
		}
		f = &failures{}
		t.keys[key] = f
	}
	f.expire(now.Add(-t.window))
	if len(f.times) >= t.limit {
		return time.Time{}, false
	}
	f.times = append(f.times, now)
	return now, true
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
	if len(f.times) == 0 {
		delete(t.keys, key)
	}
}

// clear forgets everything counted for key.
func (t *throttle) clear(key string) {
	t.mu.Lock()
	delete(t.keys, key)
	t.mu.Unlock()
}

// evictLocked drops expired keys, and if none expired, the key whose last
// attempt is oldest.
func (t *throttle) evictLocked(now time.Time) {
	var oldestKey string
	var oldest time.Time
	for k, f := range t.keys {
		f.expire(now.Add(-t.window))
		if len(f.times) == 0 {
			delete(t.keys, k)
			continue
		}
		if last := f.times[len(f.times)-1]; oldestKey == "" || last.Before(oldest) {
			oldestKey, oldest = k, last
		}
	}
	if len(t.keys) >= t.maxKeys && oldestKey != "" {
		delete(t.keys, oldestKey)
	}
}

func (f *failures) expire(before time.Time) {
	i := 0
	for i < len(f.times) && f.times[i].Before(before) {
		i++
	}
	f.times = f.times[i:]
}
