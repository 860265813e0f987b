package embedded

import (
	"context"
	"fmt"
	"sort"
	"strings"

	"github.com/cockroachdb/pebble/v2"

	"quill/internal/store"
)

func (t *txn) createMailbox(user, name string, opts store.MailboxOptions) (store.Mailbox, error) {
	if ok, err := t.exists(nameKey(user, name)); err != nil {
		return store.Mailbox{}, err
	} else if ok {
		return store.Mailbox{}, fmt.Errorf("%w: mailbox %s", store.ErrExists, name)
	}
	uv, err := t.nextUIDValidity(user)
	if err != nil {
		return store.Mailbox{}, err
	}
	m := store.Mailbox{
		ID: store.NewID(), User: user, Name: name, SpecialUse: opts.SpecialUse,
		Subscribed: opts.Subscribed, UIDValidity: uv, UIDNext: 1, HighestModSeq: 1,
	}
	t.set(nameKey(user, name), m.ID[:])
	t.putMailbox(m)
	return m, nil
}

func (e *Engine) CreateMailbox(ctx context.Context, user, name string, opts store.MailboxOptions) (store.Mailbox, error) {
	name, err := store.CanonicalName(name)
	if err != nil {
		return store.Mailbox{}, err
	}
	var m store.Mailbox
	err = e.update(ctx, func(t *txn) error {
		if ok, err := t.exists(userKey(user)); err != nil {
			return err
		} else if !ok {
			return fmt.Errorf("user %s: %w", user, store.ErrNotFound)
		}
		m, err = t.createMailbox(user, name, opts)
		return err
	})
	return m, err
}

// visible clamps a mailbox read from the database to what readers may see
// (see the package comment on fences).
func (e *Engine) visible(m store.Mailbox) store.Mailbox {
	if f, ok := e.fenced(m.ID); ok {
		f.Name, f.Subscribed, f.SpecialUse = m.Name, m.Subscribed, m.SpecialUse
		return f
	}
	return m
}

func (e *Engine) GetMailbox(ctx context.Context, user, name string) (store.Mailbox, error) {
	name, err := store.CanonicalName(name)
	if err != nil {
		return store.Mailbox{}, err
	}
	if name == "INBOX" {
		if id, ok := e.inboxes.Get(user); ok {
			if m, err := e.GetMailboxByID(ctx, id); err == nil && m.User == user && m.Name == "INBOX" {
				return m, nil
			}
		}
	}
	v, err := e.read(nameKey(user, name))
	if err != nil {
		return store.Mailbox{}, fmt.Errorf("mailbox %s of %s: %w", name, user, err)
	}
	var id store.ID
	copy(id[:], v)
	m, err := e.GetMailboxByID(ctx, id)
	if err == nil && name == "INBOX" {
		e.inboxes.Put(user, id)
	}
	return m, err
}

func (e *Engine) GetMailboxByID(ctx context.Context, id store.ID) (store.Mailbox, error) {
	v, err := e.getCommitted(mailboxKey(id))
	if err != nil {
		return store.Mailbox{}, fmt.Errorf("mailbox %s: %w", id, err)
	}
	m, err := decodeMailbox(v)
	if err != nil {
		return m, err
	}
	return e.visible(m), nil
}

func (e *Engine) ListMailboxes(ctx context.Context, user string) ([]store.Mailbox, error) {
	p := namePrefix(user)
	if err := e.settle(p); err != nil {
		return nil, err
	}
	it, err := e.db.NewIter(&pebble.IterOptions{LowerBound: p, UpperBound: prefixEnd(p)})
	if err != nil {
		return nil, err
	}
	var ids []store.ID
	for it.First(); it.Valid(); it.Next() {
		var id store.ID
		copy(id[:], it.Value())
		ids = append(ids, id)
	}
	if err := it.Close(); err != nil {
		return nil, err
	}
	out := make([]store.Mailbox, 0, len(ids))
	for _, id := range ids {
		m, err := e.GetMailboxByID(ctx, id)
		if err != nil {
			return nil, err
		}
		out = append(out, m)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

func (e *Engine) RenameMailbox(ctx context.Context, user, from, to string) error {
	from, err := store.CanonicalName(from)
	if err != nil {
		return err
	}
	if to, err = store.CanonicalName(to); err != nil {
		return err
	}
	if from == "INBOX" || to == "INBOX" || strings.HasPrefix(to, from+"/") {
		return fmt.Errorf("%w: rename %s to %s", store.ErrInvalid, from, to)
	}
	return e.update(ctx, func(t *txn) error {
		if ok, err := t.exists(nameKey(user, from)); err != nil {
			return err
		} else if !ok {
			return fmt.Errorf("mailbox %s: %w", from, store.ErrNotFound)
		}
		// The mailbox and its inferiors move together (RFC 3501 6.3.5).
		type move struct {
			old, new string
			id       store.ID
		}
		var moves []move
		p := namePrefix(user)
		err := t.scan(p, func(k, v []byte) error {
			name := string(k[len(p):])
			if name == from || strings.HasPrefix(name, from+"/") {
				var id store.ID
				copy(id[:], v)
				moves = append(moves, move{name, to + name[len(from):], id})
			}
			return nil
		})
		if err != nil {
			return err
		}
		for _, mv := range moves {
			if ok, err := t.exists(nameKey(user, mv.new)); err != nil {
				return err
			} else if ok {
				return fmt.Errorf("%w: mailbox %s", store.ErrExists, mv.new)
			}
		}
		for _, mv := range moves {
			v, err := t.get(mailboxKey(mv.id))
			if err != nil {
				return err
			}
			m, err := decodeMailbox(v)
			if err != nil {
				return err
			}
			m.Name = mv.new
			t.del(nameKey(user, mv.old))
			t.set(nameKey(user, mv.new), mv.id[:])
			t.putMailbox(m)
		}
		return nil
	})
}

func (e *Engine) DeleteMailbox(ctx context.Context, user, name string) error {
	name, err := store.CanonicalName(name)
	if err != nil {
		return err
	}
	if name == "INBOX" {
		return fmt.Errorf("%w: INBOX cannot be deleted", store.ErrInvalid)
	}
	return e.update(ctx, func(t *txn) error {
		v, err := t.get(nameKey(user, name))
		if err != nil {
			return fmt.Errorf("mailbox %s: %w", name, err)
		}
		var id store.ID
		copy(id[:], v)
		if err := t.dropMailboxContents(id); err != nil {
			return err
		}
		t.del(nameKey(user, name))
		t.del(mailboxKey(id))
		return nil
	})
}

// dropMailboxContents releases every message of a mailbox: blob references,
// quota usage, message rows and change log.
func (t *txn) dropMailboxContents(id store.ID) error {
	v, err := t.get(mailboxKey(id))
	if err != nil {
		return err
	}
	m, err := decodeMailbox(v)
	if err != nil {
		return err
	}
	var refs []store.ID
	err = t.scan(messagePrefix(id), func(k, v []byte) error {
		msg, err := decodeMessage(0, v)
		if err != nil {
			return err
		}
		refs = append(refs, msg.Blob)
		return nil
	})
	if err != nil {
		return err
	}
	for _, b := range refs {
		if err := t.addBlobRef(b, -1); err != nil {
			return err
		}
	}
	if err := t.addUsage(m.User, -m.Size, -int64(m.Messages)); err != nil {
		return err
	}
	t.deletePrefix(messagePrefix(id))
	t.deletePrefix(changePrefix(id))
	return nil
}

func (e *Engine) SetSubscribed(ctx context.Context, user, name string, subscribed bool) error {
	name, err := store.CanonicalName(name)
	if err != nil {
		return err
	}
	return e.update(ctx, func(t *txn) error {
		v, err := t.get(nameKey(user, name))
		if err != nil {
			return fmt.Errorf("mailbox %s: %w", name, err)
		}
		var id store.ID
		copy(id[:], v)
		mv, err := t.get(mailboxKey(id))
		if err != nil {
			return err
		}
		m, err := decodeMailbox(mv)
		if err != nil {
			return err
		}
		m.Subscribed = subscribed
		t.putMailbox(m)
		return nil
	})
}
