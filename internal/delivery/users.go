package delivery

import (
	"sync"
	"time"

	"quill/internal/store"
)

// maxCachedUsers bounds userCache: a full cache first drops its expired
// entries, then, if still full, all of them.
const maxCachedUsers = 1 << 16

// userCache remembers recipient lookups (an address and the user record
// it delivers to) for Options.DirectoryTTL, for engines whose lookup is a
// read over the network (Cassandra: one read per recipient otherwise).
// Only found users are kept: an address created a moment ago is
// deliverable at once on every node. A change to a user (disabled, a new
// quota) or to an alias reaches the deliveries of a node within the TTL;
// a deleted user's mail is refused at once all the same, since its INBOX
// is gone (Agent.appendInbox).
type userCache struct {
	ttl time.Duration
	mu  sync.Mutex
	m   map[string]cachedUser
}

type cachedUser struct {
	u   store.User
	exp time.Time
}

func (c *userCache) get(addr string, now time.Time) (store.User, bool) {
	c.mu.Lock()
	e, ok := c.m[addr]
	c.mu.Unlock()
	if !ok || now.After(e.exp) {
		return store.User{}, false
	}
	return e.u, true
}

func (c *userCache) put(addr string, u store.User, now time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.m) >= maxCachedUsers {
		for k, e := range c.m {
			if now.After(e.exp) {
				delete(c.m, k)
			}
		}
		if len(c.m) >= maxCachedUsers {
			clear(c.m)
		}
	}
	c.m[addr] = cachedUser{u: u, exp: now.Add(c.ttl)}
}

// maxInboxes bounds Agent.inboxes (about 60 B an entry: 16 MiB when full).
const maxInboxes = 1 << 18
