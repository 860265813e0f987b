package embedded

import (
	"encoding/binary"
	"sort"
	"sync"

	"quill/internal/store"
)

// listCache holds, for each mailbox written since it was last empty, the
// committed record of every message present in it: POP3 lists a maildrop
// at each login and expunges it at each QUIT, and both were searches of
// the LSM through the tombstones of the messages expunged before (ADR
// 0010's read half: the soft state is derived from Pebble, never the
// other way round, so dropping an entry at any moment is always safe).
//
// Invariant: an entry is complete. It is created only by the committer,
// only for a mailbox whose pre-group record counted no messages (so no
// message record of it existed), and from then on it receives every
// message write of every group that commits, in commit order, or is
// dropped. Like hotCache, it is updated after a group is durable and
// applied to Pebble and before the group's fences lift, so it only ever
// holds durable values; readers clamp what they see of a fenced mailbox as
// they do for Pebble. A prefix delete of a mailbox's messages drops its
// entry as soon as the transaction is folded into the group (txn.apply):
// early, so never stale.
//
// An entry leaves when its mailbox empties, when it exceeds listMaxLen
// messages, or, when the cache holds more than its byte budget, at
// random; the mailbox is then read from Pebble until it next empties.
// Memory thus follows the mailboxes in active use, not the users.
//
// The committer reads without the lock and writes under it; every other
// goroutine reads under it. Values are shared, never modified.
type listCache struct {
	mu    sync.RWMutex
	m     map[store.ID]*msgList
	bytes int
	max   int // byte budget; 0 disables the cache
}

// msgList is one mailbox's present messages by ascending UID.
type msgList struct {
	uids  []uint32
	vals  [][]byte
	bytes int
}

const (
	// listCacheBytes is the default budget: at a few hundred bytes per
	// record (the summary included) some 100,000 messages, which under
	// the mix is every mailbox that has mail waiting.
	listCacheBytes = 32 << 20
	// listMaxLen keeps one mailbox's inserts and removals, which move the
	// slices' tails, cheap; a mailbox that large is read from Pebble.
	listMaxLen = 1 << 14
	// listEntryBytes approximates a cached message's overhead beyond its
	// value (UID, slice header); listBaseBytes an entry's.
	listEntryBytes = 4 + 24
	listBaseBytes  = 128
)

func newListCache(max int) *listCache {
	return &listCache{m: make(map[store.ID]*msgList), max: max}
}

// mailboxOfMessageKey returns the mailbox and UID of a message key.
func mailboxOfMessageKey(k []byte) (store.ID, uint32, bool) {
	var id store.ID
	if len(k) != 1+len(id)+4 || k[0] != tMessage {
		return id, 0, false
	}
	copy(id[:], k[1:])
	return id, binary.BigEndian.Uint32(k[1+len(id):]), true
}

func (l *msgList) find(uid uint32) (int, bool) {
	i := sort.Search(len(l.uids), func(i int) bool { return l.uids[i] >= uid })
	return i, i < len(l.uids) && l.uids[i] == uid
}

// lookup is the committer's: the committed record of uid in mailbox id.
// known is false when the cache does not hold the mailbox; otherwise a nil
// value means the message does not exist.
func (c *listCache) lookup(id store.ID, uid uint32) (v []byte, known bool) {
	l := c.m[id]
	if l == nil {
		return nil, false
	}
	if i, ok := l.find(uid); ok {
		return l.vals[i], true
	}
	return nil, true
}

// get is every other goroutine's lookup, as lookup.
func (c *listCache) get(id store.ID, uid uint32) ([]byte, bool) {
	c.mu.RLock()
	defer c.mu.RUnlock()
	return c.lookup(id, uid)
}

// list returns the records of at most limit messages of mailbox id with
// UIDs from from up, ascending, and whether the cache holds the mailbox.
func (c *listCache) list(id store.ID, from uint32, limit int) (uids []uint32, vals [][]byte, ok bool) {
	c.mu.RLock()
	defer c.mu.RUnlock()
	l := c.m[id]
	if l == nil {
		return nil, nil, false
	}
	i, _ := l.find(from)
	j := i + min(limit, len(l.uids)-i)
	return append([]uint32(nil), l.uids[i:j]...), append([][]byte(nil), l.vals[i:j]...), true
}

// drop forgets mailbox id. Safe at any time, from the committer.
func (c *listCache) drop(id store.ID) {
	c.mu.Lock()
	c.dropLocked(id)
	c.mu.Unlock()
}

func (c *listCache) dropLocked(id store.ID) {
	if l := c.m[id]; l != nil {
		c.bytes -= l.bytes
		delete(c.m, id)
	}
}

// reset forgets everything, after a commit whose outcome is unknown.
func (c *listCache) reset() {
	c.mu.Lock()
	clear(c.m)
	c.bytes = 0
	c.mu.Unlock()
}

// commit takes a durable group's effects: touched holds the pre-group
// record of every mailbox the group read for update, messages the final
// value of every message key the group wrote (nil: deleted). Committer
// only.
func (c *listCache) commit(touched map[store.ID]store.Mailbox, messages map[string][]byte) {
	if c.max <= 0 {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for id, m := range touched {
		if m.Messages == 0 && c.m[id] == nil {
			c.m[id] = &msgList{bytes: listBaseBytes}
			c.bytes += listBaseBytes
		}
	}
	for k, v := range messages {
		id, uid, ok := mailboxOfMessageKey([]byte(k))
		if !ok {
			continue
		}
		l := c.m[id]
		if l == nil {
			continue
		}
		before := l.bytes
		i, found := l.find(uid)
		switch {
		case v == nil && found:
			l.bytes -= listEntryBytes + len(l.vals[i])
			l.uids = append(l.uids[:i], l.uids[i+1:]...)
			l.vals[i] = nil
			l.vals = append(l.vals[:i], l.vals[i+1:]...)
		case v != nil && found:
			l.bytes += len(v) - len(l.vals[i])
			l.vals[i] = v
		case v != nil:
			l.bytes += listEntryBytes + len(v)
			l.uids = append(l.uids, 0)
			copy(l.uids[i+1:], l.uids[i:])
			l.uids[i] = uid
			l.vals = append(l.vals, nil)
			copy(l.vals[i+1:], l.vals[i:])
			l.vals[i] = v
		}
		c.bytes += l.bytes - before
	}
	for id := range touched {
		if l := c.m[id]; l != nil && (len(l.uids) == 0 || len(l.uids) > listMaxLen) {
			c.dropLocked(id)
		}
	}
	for id := range c.m { // map order: pseudo-random victims
		if c.bytes <= c.max {
			break
		}
		c.dropLocked(id)
	}
}
