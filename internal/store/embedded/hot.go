package embedded

// hotCache holds the committed values of the records every delivery and
// expunge reads and rewrites: users, mailboxes and usage. Only the
// committer writes those tables (see the package comment), so the
// committer can keep them coherent without any locking: it fills the cache
// from what it reads and, after each successful commit, from what the group
// wrote. Reading them through the group's indexed batch otherwise costs a
// search of every memtable and level on the single goroutine all writes
// wait for.
//
// Values are shared, never modified: a transaction that changes a record
// encodes a new value. The cache is owned by the committer goroutine.
type hotCache struct {
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

func (c *hotCache) get(k []byte) ([]byte, bool) {
	v, ok := c.m[string(k)]
	return v, ok
}

// put records v as the committed value of k; nil means k does not exist.
func (c *hotCache) put(k string, v []byte) {
	if _, ok := c.m[k]; !ok && len(c.m) >= c.max {
		for old := range c.m { // map order: a pseudo-random victim
			delete(c.m, old)
			break
		}
	}
	c.m[k] = v
}

// reset forgets everything, after a commit whose outcome is unknown.
func (c *hotCache) reset() { clear(c.m) }
