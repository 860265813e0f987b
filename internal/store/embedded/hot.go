package embedded

import (
	"sync"

	"quill/internal/store"
)

// hotCache holds the committed values of the records every delivery and
// expunge reads and rewrites: users, mailboxes and usage. Only the
// committer writes those tables (see the package comment), so the
// committer can keep them coherent without any locking: it fills the cache
// from what it reads and, after each successful commit, from what the group
// wrote. Reading them through the group's indexed batch otherwise costs a
// search of every memtable and level on the single goroutine all writes
// wait for.
//
// Readers outside the committer consult it too (getCommitted), so that the
// lookups of every RCPT and POP3 login skip the LSM as well. The committer
// is its only writer: it reads without the lock and writes under it; other
// goroutines read under it. An entry is always a durable value: it is
// filled from the database between groups or from a group after its
// record is synced to the log, and updated before the group's fences are
// lifted and its requests answered (see commitGroup), so a reader never
// sees a mailbox record newer than what the fences allow nor older than an
// acknowledged write.
//
// Values are shared, never modified: a transaction that changes a record
// encodes a new value, and decoders copy what they keep.
type hotCache struct {
	mu  sync.RWMutex
	m   map[string][]byte
	max int
}

// hotCacheEntries bounds the cache: about 20 MiB at the largest records.
const hotCacheEntries = 1 << 16

func newHotCache(max int) *hotCache {
	return &hotCache{m: make(map[string][]byte), max: max}
}

// hotKey reports whether k belongs to a table the cache holds. None of
// these tables is ever deleted by prefix (txn.deletePrefix), so every write
// to them is a point write the cache sees.
func hotKey(k []byte) bool {
	return len(k) > 0 && (k[0] == tUser || k[0] == tMailbox || k[0] == tUsage)
}

// get is the committer's lookup.
func (c *hotCache) get(k []byte) ([]byte, bool) {
	v, ok := c.m[string(k)]
	return v, ok
}

// load is every other goroutine's lookup.
func (c *hotCache) load(k []byte) ([]byte, bool) {
	c.mu.RLock()
	v, ok := c.m[string(k)]
	c.mu.RUnlock()
	return v, ok
}

// put records v as the committed value of k; nil means k does not exist.
// Committer only.
func (c *hotCache) put(k string, v []byte) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, ok := c.m[k]; !ok && len(c.m) >= c.max {
		for old := range c.m { // map order: a pseudo-random victim
			delete(c.m, old)
			break
		}
	}
	c.m[k] = v
}

// reset forgets everything, after a commit whose outcome is unknown.
// Committer only.
func (c *hotCache) reset() {
	c.mu.Lock()
	clear(c.m)
	c.mu.Unlock()
}

// getCommitted returns the committed value at k for a reader outside the
// committer: from the hot cache when it holds k, else from the database.
// Like get, it returns store.ErrNotFound for a missing key.
func (e *Engine) getCommitted(k []byte) ([]byte, error) {
	if v, ok := e.hot.load(k); ok {
		if v == nil {
			return nil, store.ErrNotFound
		}
		return v, nil
	}
	return e.get(e.db, k)
}
