package cassandra

import (
	"context"
	"fmt"
	"strings"

	gocql "github.com/apache/cassandra-gocql-driver/v2"

	"quill/internal/store"
)

// head is a mailbox row: the mailbox as readers see it (after its pending
// operation, if any: see the package comment) plus the pending operation
// itself.
type head struct {
	store.Mailbox
	// raw counters as the last LWT left them (including pending)
	uidNext, modSeq, messages, size int64
	// floor is the expunge floor as the last LWT left it; readers see it
	// too, raised before the rows below it are deleted.
	floor      int64
	pending    *op
	pendingRaw []byte
	recent     [][]byte
}

const headColumns = `address, name, special_use, subscribed, uidvalidity, uidnext, modseq, messages, size, pending, recent, expunge_floor`

func scanHead(id store.ID, scan func(...any) error) (head, error) {
	var h head
	var addr, name, special *string
	var sub *bool
	var uv, un, ms, n, sz, fl *int64
	err := scan(&addr, &name, &special, &sub, &uv, &un, &ms, &n, &sz, &h.pendingRaw, &h.recent, &fl)
	if err != nil {
		return h, err
	}
	if addr == nil || un == nil {
		return h, gocql.ErrNotFound // a row left by a late write after deletion
	}
	h.ID = id
	h.User, h.Name = *addr, deref(name)
	h.SpecialUse, h.Subscribed = deref(special), sub != nil && *sub
	h.UIDValidity = uint32(deref(uv))
	h.uidNext, h.modSeq, h.messages, h.size = *un, deref(ms), deref(n), deref(sz)
	h.floor = deref(fl)
	h.UIDNext, h.HighestModSeq, h.Messages, h.Size = uint32(h.uidNext), uint64(h.modSeq), uint32(h.messages), h.size
	h.ExpungeFloor = uint64(h.floor)
	if len(h.pendingRaw) > 0 {
		o, err := decodeOp(h.pendingRaw)
		if err != nil {
			return h, err
		}
		h.pending = o
	}
	return h, nil
}

func deref[T any](p *T) T {
	var zero T
	if p == nil {
		return zero
	}
	return *p
}

func (e *Engine) readHead(ctx context.Context, id store.ID, serial bool) (head, error) {
	if err := e.requireMode(ctx, modeOrdered); err != nil {
		return head{}, err
	}
	stmt := `SELECT ` + headColumns + ` FROM mailboxes WHERE id = ?`
	q := e.read(ctx, stmt, id[:])
	if serial {
		q = e.serialRead(ctx, stmt, id[:])
	}
	h, err := scanHead(id, q.Scan)
	if err != nil {
		return h, wrap("mailbox "+id.String(), err)
	}
	return h, nil
}

// mailboxStore is what differs between the engine's two modes in the
// handling of mailbox records (mode.go): the Engine (ordered) and Batches.
// The mailbox and user calls common to both take one.
type mailboxStore interface {
	// createMailbox creates a mailbox record and claims its name.
	createMailbox(ctx context.Context, user, name string, opts store.MailboxOptions) (store.Mailbox, error)
	GetMailboxByID(ctx context.Context, id store.ID) (store.Mailbox, error)
	// deleteMailbox removes a mailbox, its messages and its name.
	deleteMailbox(ctx context.Context, m store.Mailbox) error
	// mailboxTable is the table of mailbox records, whose name and
	// subscribed columns RenameMailbox and SetSubscribed write.
	mailboxTable() string
}

var _ mailboxStore = (*Engine)(nil)

func (e *Engine) mailboxTable() string { return "mailboxes" }

func (e *Engine) createMailbox(ctx context.Context, user, name string, opts store.MailboxOptions) (store.Mailbox, error) {
	if err := e.requireMode(ctx, modeOrdered); err != nil {
		return store.Mailbox{}, err
	}
	uv, err := e.nextUIDValidity(ctx, user)
	if err != nil {
		return store.Mailbox{}, err
	}
	m := store.Mailbox{
		ID: store.NewID(), User: user, Name: name, SpecialUse: opts.SpecialUse, Subscribed: opts.Subscribed,
		UIDValidity: uv, UIDNext: 1, HighestModSeq: 1,
	}
	// The head first: a name never points at a missing mailbox.
	err = e.write(ctx, `INSERT INTO mailboxes (id, address, name, special_use, subscribed, uidvalidity, uidnext, modseq, messages, size)
		VALUES (?, ?, ?, ?, ?, ?, 1, 1, 0, 0)`, m.ID[:], user, name, opts.SpecialUse, opts.Subscribed, int64(uv)).Exec()
	if err != nil {
		return store.Mailbox{}, wrap("creating mailbox", err)
	}
	if err := e.nameMailbox(ctx, user, name, m.ID); err != nil {
		_ = e.write(ctx, `DELETE FROM mailboxes WHERE id = ?`, m.ID[:]).Exec()
		return store.Mailbox{}, err
	}
	return m, nil
}

// nameMailbox claims user's mailbox name for id (an LWT), or fails with
// ErrExists.
func (e *Engine) nameMailbox(ctx context.Context, user, name string, id store.ID) error {
	applied, err := e.cas(ctx, `INSERT INTO mailbox_names (address, name, id) VALUES (?, ?, ?) IF NOT EXISTS`,
		user, name, id[:]).MapScanCAS(map[string]any{})
	if err == nil && !applied {
		err = fmt.Errorf("%w: mailbox %s", store.ErrExists, name)
	}
	return wrap("naming mailbox "+name, err)
}

func (e *Engine) CreateMailbox(ctx context.Context, user, name string, opts store.MailboxOptions) (store.Mailbox, error) {
	return e.createMailboxOf(ctx, e, user, name, opts)
}

func (e *Engine) createMailboxOf(ctx context.Context, ms mailboxStore, user, name string, opts store.MailboxOptions) (store.Mailbox, error) {
	name, err := store.CanonicalName(name)
	if err != nil {
		return store.Mailbox{}, err
	}
	if _, err := e.GetUser(ctx, user); err != nil {
		return store.Mailbox{}, err
	}
	return ms.createMailbox(ctx, user, name, opts)
}

func (e *Engine) mailboxID(ctx context.Context, user, name string) (store.ID, error) {
	var raw []byte
	err := e.read(ctx, `SELECT id FROM mailbox_names WHERE address = ? AND name = ?`, user, name).Scan(&raw)
	if err != nil {
		return store.ID{}, wrap("mailbox "+name, err)
	}
	var id store.ID
	copy(id[:], raw)
	return id, nil
}

// GetMailbox returns a mailbox; a user's INBOX is created on first use if
// CreateUser was interrupted before creating it.
func (e *Engine) GetMailbox(ctx context.Context, user, name string) (store.Mailbox, error) {
	return e.getMailbox(ctx, e, user, name)
}

func (e *Engine) getMailbox(ctx context.Context, ms mailboxStore, user, name string) (store.Mailbox, error) {
	name, err := store.CanonicalName(name)
	if err != nil {
		return store.Mailbox{}, err
	}
	id, err := e.mailboxID(ctx, user, name)
	if isNotFound(err) && name == "INBOX" {
		if _, uerr := e.GetUser(ctx, user); uerr == nil {
			m, cerr := ms.createMailbox(ctx, user, name, store.MailboxOptions{Subscribed: true})
			if cerr == nil || !isExists(cerr) {
				return m, cerr
			}
			id, err = e.mailboxID(ctx, user, name)
		}
	}
	if err != nil {
		return store.Mailbox{}, err
	}
	return ms.GetMailboxByID(ctx, id)
}

func (e *Engine) GetMailboxByID(ctx context.Context, id store.ID) (store.Mailbox, error) {
	h, err := e.readHead(ctx, id, false)
	return h.Mailbox, err
}

func (e *Engine) ListMailboxes(ctx context.Context, user string) ([]store.Mailbox, error) {
	return e.listMailboxes(ctx, e, user)
}

func (e *Engine) listMailboxes(ctx context.Context, ms mailboxStore, user string) ([]store.Mailbox, error) {
	it := e.read(ctx, `SELECT name, id FROM mailbox_names WHERE address = ?`, user).PageSize(1000).Iter()
	var ids []store.ID
	var name string
	var raw []byte
	for it.Scan(&name, &raw) {
		var id store.ID
		copy(id[:], raw)
		ids = append(ids, id)
	}
	if err := it.Close(); err != nil {
		return nil, wrap("listing mailboxes", err)
	}
	out := make([]store.Mailbox, 0, len(ids))
	for _, id := range ids {
		m, err := ms.GetMailboxByID(ctx, id)
		if isNotFound(err) {
			continue // deleted meanwhile
		}
		if err != nil {
			return nil, err
		}
		out = append(out, m)
	}
	return out, nil // clustering order: by name
}

// RenameMailbox claims every new name (LWT) before it releases any old one;
// if a new name is taken the names claimed so far are released again.
func (e *Engine) RenameMailbox(ctx context.Context, user, from, to string) error {
	return e.renameMailbox(ctx, e, user, from, to)
}

func (e *Engine) renameMailbox(ctx context.Context, ms mailboxStore, user, from, to string) error {
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
	boxes, err := e.listMailboxes(ctx, ms, user)
	if err != nil {
		return err
	}
	type move struct {
		old, new string
		id       store.ID
	}
	var moves []move
	for _, m := range boxes {
		if m.Name == from || strings.HasPrefix(m.Name, from+"/") {
			moves = append(moves, move{m.Name, to + m.Name[len(from):], m.ID})
		}
	}
	if len(moves) == 0 || moves[0].old != from {
		return fmt.Errorf("mailbox %s: %w", from, store.ErrNotFound)
	}
	for i, mv := range moves {
		applied, err := e.cas(ctx, `INSERT INTO mailbox_names (address, name, id) VALUES (?, ?, ?) IF NOT EXISTS`,
			user, mv.new, mv.id[:]).MapScanCAS(map[string]any{})
		if err == nil && !applied {
			err = fmt.Errorf("%w: mailbox %s", store.ErrExists, mv.new)
		}
		if err != nil {
			for _, undo := range moves[:i] {
				_, _ = e.cas(ctx, `DELETE FROM mailbox_names WHERE address = ? AND name = ? IF id = ?`,
					user, undo.new, undo.id[:]).MapScanCAS(map[string]any{})
			}
			return wrap("renaming "+from, err)
		}
	}
	for _, mv := range moves {
		if err := e.write(ctx, `UPDATE `+ms.mailboxTable()+` SET name = ? WHERE id = ?`, mv.new, mv.id[:]).Exec(); err != nil {
			return wrap("renaming "+mv.old, err)
		}
		if _, err := e.cas(ctx, `DELETE FROM mailbox_names WHERE address = ? AND name = ? IF id = ?`,
			user, mv.old, mv.id[:]).MapScanCAS(map[string]any{}); err != nil {
			return wrap("releasing "+mv.old, err)
		}
	}
	return nil
}

func (e *Engine) DeleteMailbox(ctx context.Context, user, name string) error {
	return e.deleteMailboxNamed(ctx, e, user, name)
}

func (e *Engine) deleteMailboxNamed(ctx context.Context, ms mailboxStore, user, name string) error {
	name, err := store.CanonicalName(name)
	if err != nil {
		return err
	}
	if name == "INBOX" {
		return fmt.Errorf("%w: INBOX cannot be deleted", store.ErrInvalid)
	}
	id, err := e.mailboxID(ctx, user, name)
	if err != nil {
		return err
	}
	m, err := ms.GetMailboxByID(ctx, id)
	if err != nil {
		return err
	}
	return ms.deleteMailbox(ctx, m)
}

// deleteMailbox expunges every message (so blob references and blobs go
// through the ordinary path), then removes the name and the head. Run
// again after an interruption, it finishes the job.
func (e *Engine) deleteMailbox(ctx context.Context, m store.Mailbox) error {
	for {
		msgs, err := e.ListMessages(ctx, m.ID, 1, 1000)
		if err != nil {
			return err
		}
		if len(msgs) == 0 {
			break
		}
		uids := make([]uint32, len(msgs))
		for i, msg := range msgs {
			uids[i] = msg.UID
		}
		if _, _, err := e.Expunge(ctx, m.ID, uids); err != nil {
			return err
		}
	}
	h, err := e.readHead(ctx, m.ID, false)
	if err != nil {
		return err
	}
	if _, err := e.cas(ctx, `DELETE FROM mailbox_names WHERE address = ? AND name = ? IF id = ?`,
		m.User, h.Name, m.ID[:]).MapScanCAS(map[string]any{}); err != nil {
		return wrap("unnaming mailbox", err)
	}
	for b := int64(0); b <= h.modSeq>>bucketBits; b++ {
		if err := e.write(ctx, `DELETE FROM changes WHERE mailbox = ? AND bucket = ?`, m.ID[:], int(b)).Exec(); err != nil {
			return wrap("deleting change log", err)
		}
	}
	for b := int64(0); b <= h.uidNext>>bucketBits; b++ {
		if err := e.write(ctx, `DELETE FROM messages WHERE mailbox = ? AND bucket = ?`, m.ID[:], int(b)).Exec(); err != nil {
			return wrap("deleting messages", err)
		}
	}
	return wrap("deleting mailbox", e.write(ctx, `DELETE FROM mailboxes WHERE id = ?`, m.ID[:]).Exec())
}

func (e *Engine) SetSubscribed(ctx context.Context, user, name string, subscribed bool) error {
	return e.setSubscribed(ctx, e, user, name, subscribed)
}

func (e *Engine) setSubscribed(ctx context.Context, ms mailboxStore, user, name string, subscribed bool) error {
	name, err := store.CanonicalName(name)
	if err != nil {
		return err
	}
	id, err := e.mailboxID(ctx, user, name)
	if err != nil {
		return err
	}
	return wrap("subscribing", e.write(ctx, `UPDATE `+ms.mailboxTable()+` SET subscribed = ? WHERE id = ?`, subscribed, id[:]).Exec())
}
