package store

import "sync"

// InboxIDs remembers users' INBOX IDs, bounded: when full, a new entry
// displaces an arbitrary one (map order), so a server with more users than
// the bound reads some IDs again rather than growing without end. What an
// entry may be trusted for is its holder's to say: the embedded engine
// takes one as a hint it checks, the delivery agent as the INBOX until an
// append to it fails. The zero value is not usable: NewInboxIDs.
type InboxIDs struct {
	mu  sync.RWMutex
	m   map[string]ID
	max int
}

// NewInboxIDs returns an empty map of at most max entries.
func NewInboxIDs(max int) *InboxIDs {
	return &InboxIDs{m: make(map[string]ID), max: max}
}

// Get returns user's INBOX ID if remembered.
func (c *InboxIDs) Get(user string) (ID, bool) {
	c.mu.RLock()
	id, ok := c.m[user]
	c.mu.RUnlock()
	return id, ok
}

// Put remembers id as user's INBOX.
func (c *InboxIDs) Put(user string, id ID) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, ok := c.m[user]; !ok && len(c.m) >= c.max {
		for k := range c.m {
			delete(c.m, k)
			break
		}
	}
	c.m[user] = id
}

// Forget drops user's entry.
func (c *InboxIDs) Forget(user string) {
	c.mu.Lock()
	delete(c.m, user)
	c.mu.Unlock()
}

// Len is the number of entries.
func (c *InboxIDs) Len() int {
	c.mu.RLock()
	defer c.mu.RUnlock()
	return len(c.m)
}
