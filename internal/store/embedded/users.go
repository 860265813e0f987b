package embedded

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"strings"
	"time"
	"unsafe"

	"github.com/cockroachdb/pebble/v2"

	"quill/internal/store"
)

func validAddress(a string) error {
	if a == "" || len(a) > 320 || strings.IndexByte(a, 0) >= 0 {
		return fmt.Errorf("%w: address %q", store.ErrInvalid, a)
	}
	return nil
}

func (e *Engine) CreateUser(ctx context.Context, u store.User) error {
	if err := validAddress(u.Address); err != nil {
		return err
	}
	if u.Created.IsZero() {
		u.Created = time.Now()
	}
	return e.update(ctx, func(t *txn) error {
		for _, k := range [][]byte{userKey(u.Address), aliasKey(u.Address)} {
			if ok, err := t.exists(k); err != nil {
				return err
			} else if ok {
				return fmt.Errorf("%w: %s", store.ErrExists, u.Address)
			}
		}
		t.set(userKey(u.Address), encodeUser(u))
		_, err := t.createMailbox(u.Address, "INBOX", store.MailboxOptions{Subscribed: true})
		return err
	})
}

func (e *Engine) GetUser(ctx context.Context, address string) (store.User, error) {
	var buf [128]byte
	v, cached, err := e.lookupCommitted(keyIn(buf[:], tUser, address))
	if err != nil {
		return store.User{}, fmt.Errorf("user %s: %w", address, err)
	}
	if !cached {
		return decodeUser(v)
	}
	if d, ok := e.users.load(address); ok && sameValue(d.raw, v) {
		return d.user, nil
	}
	u, err := decodeUser(v)
	if err == nil {
		e.users.set(address, decodedUser{raw: v, user: u})
	}
	return u, err
}

// decodedUsers memoizes decodeUser for GetUser, which every RCPT and every
// login calls, by the identity of the value decoded. A stored value is
// never modified (hotCache), and a changed record is a new value, so a
// value with an entry's backing array and length is that entry's value;
// the entry holds the value, whose memory therefore cannot be reused for
// another while it is cached. GetUser still reads the current value each
// time: the memo never decides what a user's record is, it only spares
// decoding the same bytes again, which needs no invalidation. It holds
// only values from the hot cache: one from Pebble is a fresh copy each
// time, and one from the overlay would keep a chunk of its arena alive.
//
// Any goroutine sets it (bounded.set locks); the committer never touches it.
type decodedUser struct {
	raw  []byte
	user store.User
}

// sameValue reports whether a and b are the same stored value.
func sameValue(a, b []byte) bool {
	return len(a) == len(b) && len(a) > 0 && unsafe.SliceData(a) == unsafe.SliceData(b)
}

func (e *Engine) UpdateUser(ctx context.Context, u store.User) error {
	return e.update(ctx, func(t *txn) error {
		v, err := t.get(userKey(u.Address))
		if err != nil {
			return fmt.Errorf("user %s: %w", u.Address, err)
		}
		cur, err := decodeUser(v)
		if err != nil {
			return err
		}
		cur.PasswordHash, cur.QuotaBytes, cur.Status = u.PasswordHash, u.QuotaBytes, u.Status
		t.set(userKey(u.Address), encodeUser(cur))
		return nil
	})
}

func (e *Engine) DeleteUser(ctx context.Context, address string) error {
	return e.update(ctx, func(t *txn) error {
		if ok, err := t.exists(userKey(address)); err != nil {
			return err
		} else if !ok {
			return fmt.Errorf("user %s: %w", address, store.ErrNotFound)
		}
		err := t.scan(aliasOfPrefix(address), func(k, _ []byte) error {
			alias := string(k[len(aliasOfPrefix(address)):])
			t.del(aliasKey(alias))
			return nil
		})
		if err != nil {
			return err
		}
		t.deletePrefix(aliasOfPrefix(address))
		var ids []store.ID
		err = t.scan(namePrefix(address), func(_, v []byte) error {
			var id store.ID
			copy(id[:], v)
			ids = append(ids, id)
			return nil
		})
		if err != nil {
			return err
		}
		for _, id := range ids {
			if err := t.dropMailboxContents(id); err != nil {
				return err
			}
			t.del(mailboxKey(id))
		}
		t.deletePrefix(namePrefix(address))
		t.del(userKey(address))
		t.del(usageKey(address))
		// The UIDVALIDITY high-water mark stays: a user re-created under the
		// same address must not see old UIDVALIDITY values again.
		return nil
	})
}

func (e *Engine) ListUsers(ctx context.Context, after string, limit int) ([]store.User, error) {
	lower := userKey(after)
	if after != "" {
		lower = append(lower, 0)
	}
	if err := e.settle([]byte{tUser}); err != nil {
		return nil, err
	}
	it, err := e.db.NewIter(&pebble.IterOptions{LowerBound: lower, UpperBound: []byte{tUser + 1}})
	if err != nil {
		return nil, err
	}
	defer it.Close()
	var out []store.User
	for it.First(); it.Valid() && len(out) < limit; it.Next() {
		u, err := decodeUser(it.Value())
		if err != nil {
			return nil, err
		}
		out = append(out, u)
	}
	return out, it.Error()
}

func (e *Engine) CreateAlias(ctx context.Context, alias, target string) error {
	if err := validAddress(alias); err != nil {
		return err
	}
	return e.update(ctx, func(t *txn) error {
		for _, k := range [][]byte{userKey(alias), aliasKey(alias)} {
			if ok, err := t.exists(k); err != nil {
				return err
			} else if ok {
				return fmt.Errorf("%w: %s", store.ErrExists, alias)
			}
		}
		if ok, err := t.exists(userKey(target)); err != nil {
			return err
		} else if !ok {
			return fmt.Errorf("alias target %s: %w", target, store.ErrNotFound)
		}
		t.set(aliasKey(alias), []byte(target))
		t.set(aliasOfKey(target, alias), nil)
		return nil
	})
}

func (e *Engine) DeleteAlias(ctx context.Context, alias string) error {
	return e.update(ctx, func(t *txn) error {
		target, err := t.get(aliasKey(alias))
		if err != nil {
			return fmt.Errorf("alias %s: %w", alias, err)
		}
		t.del(aliasKey(alias))
		t.del(aliasOfKey(string(target), alias))
		return nil
	})
}

func (e *Engine) ListAliases(ctx context.Context) ([][2]string, error) {
	if err := e.settle([]byte{tAlias}); err != nil {
		return nil, err
	}
	it, err := e.db.NewIter(&pebble.IterOptions{LowerBound: []byte{tAlias}, UpperBound: []byte{tAlias + 1}})
	if err != nil {
		return nil, err
	}
	defer it.Close()
	var out [][2]string
	for it.First(); it.Valid(); it.Next() {
		out = append(out, [2]string{string(it.Key()[1:]), string(it.Value())})
	}
	return out, it.Error()
}

func (e *Engine) Resolve(ctx context.Context, address string) (string, error) {
	var buf [128]byte
	if _, err := e.getCommitted(keyIn(buf[:], tUser, address)); err == nil {
		return address, nil
	} else if !errors.Is(err, store.ErrNotFound) {
		return "", err
	}
	v, err := e.read(aliasKey(address))
	if err != nil {
		return "", fmt.Errorf("address %s: %w", address, err)
	}
	return string(v), nil
}

func (e *Engine) Usage(ctx context.Context, user string) (store.Usage, error) {
	v, err := e.getCommitted(usageKey(user))
	if errors.Is(err, store.ErrNotFound) {
		if _, err := e.GetUser(ctx, user); err != nil {
			return store.Usage{}, err
		}
		return store.Usage{}, nil
	}
	if err != nil {
		return store.Usage{}, err
	}
	return decodeUsage(v)
}

// nextUIDValidity hands out a UIDVALIDITY for a new mailbox of user: the
// current time in seconds, but always above every value handed out before,
// so a mailbox deleted and re-created never repeats one (RFC 3501 2.3.1.1).
func (t *txn) nextUIDValidity(user string) (uint32, error) {
	v, err := t.get(validityKey(user))
	var last uint32
	switch {
	case err == nil && len(v) == 4:
		last = binary.BigEndian.Uint32(v)
	case err == nil:
		return 0, errCorrupt
	case !errors.Is(err, store.ErrNotFound):
		return 0, err
	}
	next := uint32(time.Now().Unix())
	if next <= last {
		next = last + 1
	}
	t.set(validityKey(user), binary.BigEndian.AppendUint32(nil, next))
	return next, nil
}
