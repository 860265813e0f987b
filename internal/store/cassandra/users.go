package cassandra

import (
	"context"
	"fmt"
	"hash/fnv"
	"slices"
	"strings"
	"time"

	gocql "github.com/apache/cassandra-gocql-driver/v2"

	"quill/internal/store"
)

func validAddress(a string) error {
	if a == "" || len(a) > 320 || strings.IndexByte(a, 0) >= 0 {
		return fmt.Errorf("%w: address %q", store.ErrInvalid, a)
	}
	return nil
}

func shardOf(address string) int {
	h := fnv.New32a()
	h.Write([]byte(address))
	return int(h.Sum32() % indexShards)
}

// CreateUser claims the address with an LWT, lists it in the directory and
// creates its INBOX. A crash between the steps leaves a user whose INBOX
// GetMailbox creates on first use and whose directory entry Check reports.
func (e *Engine) CreateUser(ctx context.Context, u store.User) error {
	return e.createUser(ctx, e, u)
}

func (e *Engine) createUser(ctx context.Context, ms mailboxStore, u store.User) error {
	if err := validAddress(u.Address); err != nil {
		return err
	}
	if u.Created.IsZero() {
		u.Created = time.Now()
	}
	applied, err := e.cas(ctx, `INSERT INTO addresses (address, password_hash, quota, status, created) VALUES (?, ?, ?, ?, ?) IF NOT EXISTS`,
		u.Address, u.PasswordHash, u.QuotaBytes, int8(u.Status), u.Created).MapScanCAS(map[string]any{})
	if err != nil {
		return wrap("creating user "+u.Address, err)
	}
	if !applied {
		return fmt.Errorf("%w: %s", store.ErrExists, u.Address)
	}
	if err := e.write(ctx, `INSERT INTO directory (kind, shard, address) VALUES ('u', ?, ?)`, shardOf(u.Address), u.Address).Exec(); err != nil {
		return wrap("listing user "+u.Address, err)
	}
	_, err = ms.createMailbox(ctx, u.Address, "INBOX", store.MailboxOptions{Subscribed: true})
	return err
}

// lookup returns an address's row: its target ("" for a user) and user fields.
func (e *Engine) lookup(ctx context.Context, address string) (string, store.User, error) {
	var target, hash *string
	var quota *int64
	var status *int8
	var created *time.Time
	err := e.read(ctx, `SELECT target, password_hash, quota, status, created FROM addresses WHERE address = ?`, address).
		Scan(&target, &hash, &quota, &status, &created)
	if err != nil {
		return "", store.User{}, wrap("address "+address, err)
	}
	u := store.User{Address: address}
	if hash != nil {
		u.PasswordHash = *hash
	}
	if quota != nil {
		u.QuotaBytes = *quota
	}
	if status != nil {
		u.Status = store.UserStatus(*status)
	}
	if created != nil {
		u.Created = *created
	}
	if target != nil {
		return *target, u, nil
	}
	return "", u, nil
}

func (e *Engine) GetUser(ctx context.Context, address string) (store.User, error) {
	target, u, err := e.lookup(ctx, address)
	if err != nil {
		return store.User{}, err
	}
	if target != "" {
		return store.User{}, fmt.Errorf("user %s: %w", address, store.ErrNotFound)
	}
	return u, nil
}

func (e *Engine) UpdateUser(ctx context.Context, u store.User) error {
	applied, err := e.cas(ctx, `UPDATE addresses SET password_hash = ?, quota = ?, status = ? WHERE address = ? IF target = null AND created != null`,
		u.PasswordHash, u.QuotaBytes, int8(u.Status), u.Address).MapScanCAS(map[string]any{})
	if err != nil {
		return wrap("updating user "+u.Address, err)
	}
	if !applied {
		return fmt.Errorf("user %s: %w", u.Address, store.ErrNotFound)
	}
	return nil
}

// DeleteUser removes the aliases, the mailboxes (with their messages and
// blob references) and finally the address, so that an interrupted delete
// can be run again.
func (e *Engine) DeleteUser(ctx context.Context, address string) error {
	return e.deleteUser(ctx, e, address)
}

func (e *Engine) deleteUser(ctx context.Context, ms mailboxStore, address string) error {
	if _, err := e.GetUser(ctx, address); err != nil {
		return err
	}
	aliases, err := e.ListAliases(ctx)
	if err != nil {
		return err
	}
	for _, a := range aliases {
		if a[1] == address {
			if err := e.DeleteAlias(ctx, a[0]); err != nil && !isNotFound(err) {
				return err
			}
		}
	}
	boxes, err := e.listMailboxes(ctx, ms, address)
	if err != nil {
		return err
	}
	for _, m := range boxes {
		if err := ms.deleteMailbox(ctx, m); err != nil {
			return err
		}
	}
	if err := e.write(ctx, `DELETE FROM directory WHERE kind = 'u' AND shard = ? AND address = ?`, shardOf(address), address).Exec(); err != nil {
		return wrap("unlisting user", err)
	}
	applied, err := e.cas(ctx, `DELETE FROM addresses WHERE address = ? IF target = null AND created != null`, address).MapScanCAS(map[string]any{})
	if err != nil {
		return wrap("deleting user "+address, err)
	}
	if !applied {
		return fmt.Errorf("user %s: %w", address, store.ErrNotFound)
	}
	return nil
}

// listDirectory merges the shards of kind ('u' or 'a') in address order,
// returning up to limit entries after after (limit <= 0: all).
func (e *Engine) listDirectory(ctx context.Context, kind, after string, limit int) ([][2]string, error) {
	var all [][2]string
	for shard := 0; shard < indexShards; shard++ {
		q := `SELECT address, target FROM directory WHERE kind = ? AND shard = ? AND address > ?`
		args := []any{kind, shard, after}
		if limit > 0 {
			q += ` LIMIT ?`
			args = append(args, limit)
		}
		it := e.read(ctx, q, args...).PageSize(1000).Iter()
		var addr string
		var target *string
		for it.Scan(&addr, &target) {
			t := ""
			if target != nil {
				t = *target
			}
			all = append(all, [2]string{addr, t})
		}
		if err := it.Close(); err != nil {
			return nil, wrap("listing directory", err)
		}
	}
	slices.SortFunc(all, func(a, b [2]string) int { return strings.Compare(a[0], b[0]) })
	if limit > 0 && len(all) > limit {
		all = all[:limit]
	}
	return all, nil
}

func (e *Engine) ListUsers(ctx context.Context, after string, limit int) ([]store.User, error) {
	if limit <= 0 {
		return nil, nil
	}
	entries, err := e.listDirectory(ctx, "u", after, limit)
	if err != nil {
		return nil, err
	}
	out := make([]store.User, 0, len(entries))
	for _, en := range entries {
		u, err := e.GetUser(ctx, en[0])
		if isNotFound(err) {
			continue // deleted meanwhile
		}
		if err != nil {
			return nil, err
		}
		out = append(out, u)
	}
	return out, nil
}

func (e *Engine) CreateAlias(ctx context.Context, alias, target string) error {
	if err := validAddress(alias); err != nil {
		return err
	}
	if _, err := e.GetUser(ctx, target); err != nil {
		return err
	}
	applied, err := e.cas(ctx, `INSERT INTO addresses (address, target) VALUES (?, ?) IF NOT EXISTS`, alias, target).MapScanCAS(map[string]any{})
	if err != nil {
		return wrap("creating alias "+alias, err)
	}
	if !applied {
		return fmt.Errorf("%w: %s", store.ErrExists, alias)
	}
	return wrap("listing alias", e.write(ctx, `INSERT INTO directory (kind, shard, address, target) VALUES ('a', ?, ?, ?)`,
		shardOf(alias), alias, target).Exec())
}

func (e *Engine) DeleteAlias(ctx context.Context, alias string) error {
	applied, err := e.cas(ctx, `DELETE FROM addresses WHERE address = ? IF target != null`, alias).MapScanCAS(map[string]any{})
	if err != nil {
		return wrap("deleting alias "+alias, err)
	}
	if err := e.write(ctx, `DELETE FROM directory WHERE kind = 'a' AND shard = ? AND address = ?`, shardOf(alias), alias).Exec(); err != nil {
		return wrap("unlisting alias", err)
	}
	if !applied {
		return fmt.Errorf("alias %s: %w", alias, store.ErrNotFound)
	}
	return nil
}

func (e *Engine) ListAliases(ctx context.Context) ([][2]string, error) {
	return e.listDirectory(ctx, "a", "", 0)
}

func (e *Engine) Resolve(ctx context.Context, address string) (string, error) {
	target, _, err := e.lookup(ctx, address)
	if err != nil {
		return "", err
	}
	if target == "" {
		return address, nil
	}
	return target, nil
}

// nextUIDValidity returns a UIDVALIDITY for a new mailbox of user, greater
// than every one handed out before (an LWT on a row that outlives the user)
// and at least the current Unix time, so that it does not repeat even if
// that row is lost.
func (e *Engine) nextUIDValidity(ctx context.Context, user string) (uint32, error) {
	for attempt := 0; ; attempt++ {
		var last *int64
		err := e.serialRead(ctx, `SELECT last FROM uidvalidity WHERE address = ?`, user).Scan(&last)
		if err != nil && err != gocql.ErrNotFound {
			return 0, wrap("reading uidvalidity", err)
		}
		next := time.Now().Unix()
		var q *gocql.Query
		if last == nil {
			q = e.cas(ctx, `INSERT INTO uidvalidity (address, last) VALUES (?, ?) IF NOT EXISTS`, user, next)
		} else {
			next = max(next, *last+1)
			q = e.cas(ctx, `UPDATE uidvalidity SET last = ? WHERE address = ? IF last = ?`, next, user, *last)
		}
		applied, err := q.MapScanCAS(map[string]any{})
		if err != nil {
			return 0, wrap("allocating uidvalidity", err)
		}
		if applied {
			return uint32(next), nil
		}
		if err := backoff(ctx, attempt); err != nil {
			return 0, err
		}
	}
}

func (e *Engine) Usage(ctx context.Context, user string) (store.Usage, error) {
	return e.usage(ctx, e, user)
}

// usage sums the counts of user's mailbox heads: both modes keep a
// user's usage there and nowhere else.
func (e *Engine) usage(ctx context.Context, ms mailboxStore, user string) (store.Usage, error) {
	if _, err := e.GetUser(ctx, user); err != nil {
		return store.Usage{}, err
	}
	boxes, err := e.listMailboxes(ctx, ms, user)
	if err != nil {
		return store.Usage{}, err
	}
	var u store.Usage
	for _, m := range boxes {
		u.Bytes += m.Size
		u.Messages += int64(m.Messages)
	}
	return u, nil
}
