package embedded

import (
	"bytes"
	"sync"

	"quill/internal/store"
)

// hotCache holds the committed values of records that deliveries and
// expunges read and rewrite, so that neither the committer nor a reader
// pays a search of every memtable and level for them. The engine keeps two:
// hot, for users, mailboxes and usage, which every delivery and expunge
// reads and rewrites; and blobs (a blobCache), for the blob records ('B')
// that every delivery writes and every retrieval (OpenBlob) and expunge
// reads.
// Only the committer writes those tables (see the package comment), so the
// committer can keep them coherent without any locking: it fills the cache
// from what it reads and, after each successful commit, from what the group
// wrote.
//
// Readers outside the committer consult it too (getCommitted), so that the
// lookups of every RCPT, POP3 login and body retrieval skip the LSM as
// well. The committer is its only writer: it reads without the lock and
// writes under it; other goroutines read under it. An entry is always a
// durable value: it is filled from the database between groups or from a
// group after its record is synced to the log, and updated before the
// group's fences are lifted and its requests answered (see commitGroup), so
// a reader never sees a mailbox record newer than what the fences allow nor
// older than an acknowledged write.
//
// Values are shared, never modified: a transaction that changes a record
// encodes a new value, and decoders copy what they keep.
type hotCache struct {
	bounded[string, []byte] // a nil value: known absent
}

// bounded is the map of both caches: at most max entries, a pseudo-random
// one evicted for a new key. The committer writes it under mu and reads it
// without; other goroutines read it under mu. (GetUser's memo, which the
// committer never touches, is one too: there every goroutine reads and
// writes under mu, with load and set.)
type bounded[K comparable, V any] struct {
	mu  sync.RWMutex
	m   map[K]V
	max int
}

func newBounded[K comparable, V any](max int) bounded[K, V] {
	return bounded[K, V]{m: make(map[K]V), max: max}
}

// get is the committer's lookup.
func (c *bounded[K, V]) get(k K) (V, bool) {
	v, ok := c.m[k]
	return v, ok
}

// load is every other goroutine's lookup.
func (c *bounded[K, V]) load(k K) (V, bool) {
	c.mu.RLock()
	v, ok := c.m[k]
	c.mu.RUnlock()
	return v, ok
}

// set records v at k. In the caches, committer only.
func (c *bounded[K, V]) set(k K, v V) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.m) >= c.max {
		if _, ok := c.m[k]; !ok {
			for old := range c.m { // map order: a pseudo-random victim
				delete(c.m, old)
				break
			}
		}
	}
	c.m[k] = v
}

// forget deletes k. Committer only.
func (c *bounded[K, V]) forget(k K) {
	c.mu.Lock()
	delete(c.m, k)
	c.mu.Unlock()
}

// reset forgets everything, after a commit whose outcome is unknown.
// Committer only.
func (c *bounded[K, V]) reset() {
	c.mu.Lock()
	clear(c.m)
	c.mu.Unlock()
}

// hotCacheEntries bounds the hot cache: about 20 MiB at the largest
// records. blobCacheEntries bounds the blob cache, about 8 MiB: an entry is
// a blob ID and its decoded record.
// A blob's record is read twice (its retrieval and its expunge), typically
// seconds after it was written, so the cache need hold only the bodies
// delivered in that window, not every stored one.
const (
	hotCacheEntries  = 1 << 16
	blobCacheEntries = 1 << 17
)

func newHotCache(max int) *hotCache {
	return &hotCache{newBounded[string, []byte](max)}
}

// cacheFor returns the cache that holds the keys of table, or nil. None of
// the cached tables is ever deleted by prefix (txn.deletePrefix), so every
// write to them is a point write the cache sees.
func (e *Engine) cacheFor(table byte) *hotCache {
	switch table {
	case tUser, tMailbox, tUsage:
		return e.hot
	}
	return nil
}

// cacheOf returns the cache that holds k, or nil.
func (e *Engine) cacheOf(k []byte) *hotCache {
	if len(k) == 0 {
		return nil
	}
	return e.cacheFor(k[0])
}

// get is the committer's lookup (bounded.get by a key in bytes, which
// the map index converts without allocating).
func (c *hotCache) get(k []byte) ([]byte, bool) {
	v, ok := c.m[string(k)]
	return v, ok
}

// load is every other goroutine's lookup (bounded.load by bytes).
func (c *hotCache) load(k []byte) ([]byte, bool) {
	c.mu.RLock()
	v, ok := c.m[string(k)]
	c.mu.RUnlock()
	return v, ok
}

// put records v as the committed value of k; nil means k does not exist,
// which the cache remembers (known absent): that spares the lookups of
// unknown recipients. Committer only.
func (c *hotCache) put(k string, v []byte) { c.set(k, v) }

// getCommitted returns the committed value at k for a reader outside the
// committer: from its cache when one holds k, else from the overlay and
// Pebble (Engine.read). Like get, it returns store.ErrNotFound for a
// missing key.
func (e *Engine) getCommitted(k []byte) ([]byte, error) {
	v, _, err := e.lookupCommitted(k)
	return v, err
}

// lookupCommitted is getCommitted, also reporting whether the value came
// from the hot cache: such a value is an allocation of its own, where one
// from the overlay lies in a chunk of its arena, which anything holding it
// keeps alive. It keeps no reference to k, so a caller may build k on its
// stack (keyIn): a hit, the common case, then allocates nothing.
func (e *Engine) lookupCommitted(k []byte) (v []byte, cached bool, err error) {
	if c := e.cacheOf(k); c != nil {
		if v, ok := c.load(k); ok {
			if v == nil {
				return nil, true, store.ErrNotFound
			}
			return v, true, nil
		}
	}
	v, err = e.read(bytes.Clone(k))
	return v, false, err
}

// blobCache is the hot cache of blob records, decoded and keyed by blob ID.
// It follows hotCache's rules (the committer its only writer, entries
// always durable values, a deleted record forgotten), but holds no
// pointers: a hotCache of its size was some 250,000 small objects (keys
// and values) that the collector marked in every cycle, and a reader gets
// the record without decoding it.
type blobCache struct {
	bounded[store.ID, blobRecord]
}

func newBlobCache(max int) *blobCache {
	return &blobCache{newBounded[store.ID, blobRecord](max)}
}

// put records v, an encoded blob record, as the committed record of id;
// nil (or a record that does not decode, which its readers will report)
// forgets id. Committer only.
func (c *blobCache) put(id store.ID, v []byte) {
	if r, err := decodeBlob(v); v != nil && err == nil {
		c.set(id, r)
	} else {
		c.forget(id)
	}
}

// blobOfKey returns the blob ID of a blob record's key.
func blobOfKey[K string | []byte](k K) (store.ID, bool) {
	var id store.ID
	if len(k) != 1+len(id) || k[0] != tBlob {
		return id, false
	}
	copy(id[:], k[1:])
	return id, true
}

// committedBlob returns the committed record of blob id for a reader
// outside the committer (getCommitted for blob records).
func (e *Engine) committedBlob(id store.ID) (blobRecord, error) {
	if r, ok := e.blobs.load(id); ok {
		return r, nil
	}
	v, err := e.read(blobKey(id))
	if err != nil {
		return blobRecord{}, err
	}
	return decodeBlob(v)
}
