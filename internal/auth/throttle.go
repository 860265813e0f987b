package auth

import (
	"sync"
	"time"
)

// throttle counts authentication failures per key (a remote IP, a user) in
// a sliding window. Once a key reaches the limit it is refused until its
// oldest counted failure leaves the window (refused attempts are not
// verified, so they are not counted). Memory is bounded: at most maxKeys keys are
// tracked, the stalest dropped first.
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

// blocked reports whether key has used up its failures.
func (t *throttle) blocked(key string) bool {
	if t.limit <= 0 {
		return false
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	f := t.keys[key]
	if f == nil {
		return false
	}
	f.expire(t.now().Add(-t.window))
	if len(f.times) == 0 {
		delete(t.keys, key)
		return false
	}
	return len(f.times) >= t.limit
}

// fail records a failure for key.
func (t *throttle) fail(key string) {
	if t.limit <= 0 {
		return
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
		f.times = f.times[1:]
	}
	f.times = append(f.times, now)
}

// succeed forgets key's failures.
func (t *throttle) succeed(key string) {
	t.mu.Lock()
	delete(t.keys, key)
	t.mu.Unlock()
}

// evictLocked drops expired keys, and if none expired, the key whose last
// failure is oldest.
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
