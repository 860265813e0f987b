package delivery

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"quill/internal/store"
)

// countingStore counts the reads of users and of usage that delivery makes
// of the real store beneath it.
type countingStore struct {
	Store
	reads, usages atomic.Int64
}

func (c *countingStore) Usage(ctx context.Context, user string) (store.Usage, error) {
	c.usages.Add(1)
	return c.Store.Usage(ctx, user)
}

func (c *countingStore) KnownRoom(user string, quota, size int64) (room, known bool) {
	return c.Store.(RoomKnower).KnownRoom(user, quota, size)
}

func (c *countingStore) GetUser(ctx context.Context, address string) (store.User, error) {
	c.reads.Add(1)
	return c.Store.GetUser(ctx, address)
}

func TestDirectoryCache(t *testing.T) {
	plain, e := setup(t)
	cs := &countingStore{Store: e}
	a := NewAgent(cs, Options{Domains: plain.opts.Domains, DirectoryTTL: time.Hour})
	ctx := context.Background()

	for range 3 {
		if r, err := a.Resolve(ctx, addr(t, "alice@example.test"), ResolveOptions{}); err != nil || r.User != "alice@example.test" {
			t.Fatalf("Resolve(alice) = %+v, %v", r, err)
		}
	}
	if n := cs.reads.Load(); n != 1 {
		t.Errorf("three resolutions of one address read the directory %d times, want 1", n)
	}

	// An address not found is not remembered: created now, it is
	// deliverable at once.
	if _, err := a.Resolve(ctx, addr(t, "carol@example.test"), ResolveOptions{}); !errors.Is(err, ErrNoSuchUser) {
		t.Fatalf("Resolve(carol) before she exists: %v", err)
	}
	if err := e.CreateUser(ctx, store.User{Address: "carol@example.test", PasswordHash: "$argon2id$x"}); err != nil {
		t.Fatal(err)
	}
	r, err := a.Resolve(ctx, addr(t, "carol@example.test"), ResolveOptions{})
	if err != nil {
		t.Fatalf("Resolve(carol) after she was created: %v", err)
	}
	if c, ok := a.users.get("carol@example.test", time.Now()); !ok || c.PasswordHash != "" {
		t.Errorf("cached carol = %+v, %v; want her record without its password hash", c, ok)
	}

	// A user deleted while remembered resolves from the cache, but her
	// mail is refused, not stored, whether or not her INBOX is cached.
	deliver := func() error { return deliverOne(a, r) }
	if err := deliver(); err != nil {
		t.Fatal(err)
	}
	if err := e.DeleteUser(ctx, "carol@example.test"); err != nil {
		t.Fatal(err)
	}
	if r, err = a.Resolve(ctx, addr(t, "carol@example.test"), ResolveOptions{}); err != nil {
		t.Fatalf("Resolve(carol) within the TTL after her deletion: %v", err)
	}
	if err := deliver(); !errors.Is(err, ErrNoSuchUser) {
		t.Errorf("delivery to a deleted user: %v, want ErrNoSuchUser", err)
	}
}

func TestUserCacheExpiresAndIsBounded(t *testing.T) {
	c := &userCache{ttl: time.Second, m: map[string]cachedUser{}}
	t0 := time.Unix(1e9, 0)
	c.put("a@x", store.User{Address: "a@x"}, t0)
	if _, ok := c.get("a@x", t0.Add(time.Second)); !ok {
		t.Error("entry gone before its TTL")
	}
	if _, ok := c.get("a@x", t0.Add(time.Second+1)); ok {
		t.Error("entry served after its TTL")
	}
	// A full cache drops what expired first, and everything only when
	// nothing did.
	for i := range maxCachedUsers - 1 {
		c.put(strconv.Itoa(i)+"@x", store.User{}, t0.Add(2*time.Second))
	}
	if len(c.m) != maxCachedUsers {
		t.Fatalf("cache holds %d entries, want %d", len(c.m), maxCachedUsers)
	}
	c.put("b@x", store.User{}, t0.Add(2*time.Second))
	if _, ok := c.m["a@x"]; ok || len(c.m) != maxCachedUsers {
		t.Errorf("after an expired entry was dropped: a@x kept %v, %d entries", ok, len(c.m))
	}
	c.put("c@x", store.User{}, t0.Add(2*time.Second))
	if len(c.m) != 1 {
		t.Errorf("a full cache of live entries holds %d after a put, want 1", len(c.m))
	}
}

// A recipient with a quota whose usage the manager keeps costs no read of
// the usage at RCPT time, and is refused from what the manager knows.
func TestQuotaCheckFromTheManager(t *testing.T) {
	plain, e := setup(t)
	cs := &countingStore{Store: e}
	a := NewAgent(cs, Options{Domains: plain.opts.Domains})
	ctx := context.Background()
	r, err := a.Resolve(ctx, addr(t, "bob@example.test"), ResolveOptions{Size: 60})
	if err != nil {
		t.Fatal(err)
	}
	if n := cs.usages.Load(); n != 1 {
		t.Fatalf("the first check read the usage %d times, want 1", n)
	}
	res, err := a.Deliver(ctx, Message{Recipients: []Recipient{r}, Body: strings.NewReader(strings.Repeat("x", 58) + "\r\n")})
	if err != nil || res[0] != nil {
		t.Fatal(err, res)
	}
	if _, err := a.Resolve(ctx, addr(t, "bob@example.test"), ResolveOptions{Size: 40}); err != nil {
		t.Errorf("40 more octets beside 60 under a quota of 100: %v", err)
	}
	if _, err := a.Resolve(ctx, addr(t, "bob@example.test"), ResolveOptions{Size: 41}); !errors.Is(err, ErrMailboxFull) {
		t.Errorf("41 more octets beside 60 under a quota of 100: %v, want ErrMailboxFull", err)
	}
	if n := cs.usages.Load(); n != 1 {
		t.Errorf("checks after a delivery read the usage %d times in all, want 1", n)
	}
}
