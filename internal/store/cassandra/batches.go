package cassandra

import (
	"context"
	"io"
	"log/slog"
	"sync"
	"time"

	gocql "github.com/apache/cassandra-gocql-driver/v2"

	"quill/internal/store"
)

// Batches is the engine's batch mode (ADR 0026): a store.Engine whose
// mailbox writes are the user managers' batches (store.BatchWriter),
// fenced by the writer's epoch (store.Adopter, ADR 0024), with no
// conditional write per message. It shares the engine's session,
// directory, blobs and maildrop leases, keeps mailboxes in tables of its
// own (bmailboxes, bmessages, bchanges) and has no ordered writes: a
// keyspace holds the mailboxes of one mode only (mode.go).
//
// The rules of ADR 0024 as this type keeps them:
//   - Every mailbox write carries the timestamp 1<<62 | E<<32 | n, E the
//     batch's epoch and n a per-mailbox counter (batchwrite.go).
//   - The head columns of bmailboxes and the rows of bmessages and
//     bchanges are written by batches, adoptions and their garbage
//     collection only.
//   - A flag change or expunge adds a version; nothing a reader takes for
//     a message's state is overwritten in place.
//   - A batch's rows are written first, its mailboxes' heads last, each at
//     the write consistency; heads are written in submission order.
//   - Readers read the head first and nothing above it, and take each
//     UID's latest valid version (batchread.go).
//   - AdoptMailbox reads the head at the serial consistency and writes
//     range tombstones at base(E)-1 over UIDs >= UIDNEXT and MODSEQs >
//     HIGHESTMODSEQ, then the head at base(E).
//   - Superseded versions, expunged rows, pruned expunges and released
//     blobs are deleted after the batch that supersedes them was
//     acknowledged, by this process, once it has read the head back (at
//     the read consistency) with its own epoch (batchgc.go).
type Batches struct {
	e *Engine

	mu     sync.Mutex
	mboxes map[store.ID]*bmbox // guarded by mu
	users  map[string]*bpipe   // guarded by mu

	gc  *collector
	log *slog.Logger
	// win is how far beyond its verified head this view writes: window,
	// or less in tests.
	win int64
	// grace is how long superseded versions and expunged rows outlive
	// the batch that makes them garbage (batchgc.go): defaultGrace, or
	// less in tests. Readers that take half of it start again.
	grace time.Duration
	// noFence, set only by tests, makes adoptions skip their tombstones:
	// TestFencingWithoutTombstones shows that the fencing test then fails.
	noFence bool
}

var (
	_ store.Engine      = (*Batches)(nil)
	_ store.BatchWriter = (*Batches)(nil)
	_ store.Adopter     = (*Batches)(nil)
	_ mailboxStore      = (*Batches)(nil)
)

// Batches returns the engine's batch mode view, the same value at every
// call. Its Close closes the engine. The first mailbox call through it
// records the keyspace's mode as "batches"; the engine's own mailbox calls
// then fail with ErrModeMismatch, and so does every call of the batch
// mode on a keyspace that holds ordered mailboxes.
func (e *Engine) Batches() *Batches {
	e.batchesOnce.Do(func() {
		b := &Batches{e: e, mboxes: map[store.ID]*bmbox{}, users: map[string]*bpipe{}, log: e.log, win: window, grace: defaultGrace}
		b.gc = newCollector(b)
		e.batches = b
	})
	return e.batches
}

// Close closes the engine: its collector finishes what it has queued
// (within the engine's request timeout) and stops, and the batches in
// flight end before the session closes.
func (b *Batches) Close() error { return b.e.Close() }

func (b *Batches) require(ctx context.Context) error { return b.e.requireMode(ctx, modeBatches) }

// The directory, blobs and maildrop leases are the engine's.

func (b *Batches) CreateUser(ctx context.Context, u store.User) error {
	if err := b.require(ctx); err != nil {
		return err
	}
	return b.e.createUser(ctx, b, u)
}
func (b *Batches) GetUser(ctx context.Context, address string) (store.User, error) {
	return b.e.GetUser(ctx, address)
}
func (b *Batches) UpdateUser(ctx context.Context, u store.User) error { return b.e.UpdateUser(ctx, u) }
func (b *Batches) DeleteUser(ctx context.Context, address string) error {
	if err := b.require(ctx); err != nil {
		return err
	}
	return b.e.deleteUser(ctx, b, address)
}
func (b *Batches) ListUsers(ctx context.Context, after string, limit int) ([]store.User, error) {
	return b.e.ListUsers(ctx, after, limit)
}
func (b *Batches) CreateAlias(ctx context.Context, alias, target string) error {
	return b.e.CreateAlias(ctx, alias, target)
}
func (b *Batches) DeleteAlias(ctx context.Context, alias string) error {
	return b.e.DeleteAlias(ctx, alias)
}
func (b *Batches) ListAliases(ctx context.Context) ([][2]string, error) { return b.e.ListAliases(ctx) }
func (b *Batches) Resolve(ctx context.Context, address string) (string, error) {
	return b.e.Resolve(ctx, address)
}
func (b *Batches) PutBlob(ctx context.Context, r io.Reader, maxSize int64) (store.ID, int64, error) {
	return b.e.PutBlob(ctx, r, maxSize)
}
func (b *Batches) OpenBlob(ctx context.Context, id store.ID) (store.BlobReader, error) {
	return b.e.OpenBlob(ctx, id)
}
func (b *Batches) LockMaildrop(ctx context.Context, user string) (store.MaildropLease, error) {
	return b.e.LockMaildrop(ctx, user)
}
func (b *Batches) Usage(ctx context.Context, user string) (store.Usage, error) {
	if err := b.require(ctx); err != nil {
		return store.Usage{}, err
	}
	return b.e.usage(ctx, b, user)
}

// Mailbox records.

func (b *Batches) mailboxTable() string { return "bmailboxes" }

func (b *Batches) CreateMailbox(ctx context.Context, user, name string, opts store.MailboxOptions) (store.Mailbox, error) {
	return b.e.createMailboxOf(ctx, b, user, name, opts)
}

// createMailbox writes the descriptive columns only: a mailbox without
// head columns is at UIDNEXT 1, HIGHESTMODSEQ 1, empty, adopted by no
// epoch, and its first manager's adoption writes its head.
func (b *Batches) createMailbox(ctx context.Context, user, name string, opts store.MailboxOptions) (store.Mailbox, error) {
	if err := b.require(ctx); err != nil {
		return store.Mailbox{}, err
	}
	e := b.e
	uv, err := e.nextUIDValidity(ctx, user)
	if err != nil {
		return store.Mailbox{}, err
	}
	m := store.Mailbox{
		ID: store.NewID(), User: user, Name: name, SpecialUse: opts.SpecialUse, Subscribed: opts.Subscribed,
		UIDValidity: uv, UIDNext: 1, HighestModSeq: 1,
	}
	// The record first: a name never points at a missing mailbox.
	err = e.write(ctx, `INSERT INTO bmailboxes (id, address, name, special_use, subscribed, uidvalidity) VALUES (?, ?, ?, ?, ?, ?)`,
		m.ID[:], user, name, opts.SpecialUse, opts.Subscribed, int64(uv)).Exec()
	if err != nil {
		return store.Mailbox{}, wrap("creating mailbox", err)
	}
	if err := e.nameMailbox(ctx, user, name, m.ID); err != nil {
		_ = e.write(ctx, `DELETE FROM bmailboxes USING TIMESTAMP ? WHERE id = ?`, tsForever, m.ID[:]).Exec()
		return store.Mailbox{}, err
	}
	return m, nil
}

func (b *Batches) GetMailbox(ctx context.Context, user, name string) (store.Mailbox, error) {
	if err := b.require(ctx); err != nil {
		return store.Mailbox{}, err
	}
	return b.e.getMailbox(ctx, b, user, name)
}

func (b *Batches) GetMailboxByID(ctx context.Context, id store.ID) (store.Mailbox, error) {
	h, err := b.readHead(ctx, id, false)
	return h.Mailbox, err
}

func (b *Batches) ListMailboxes(ctx context.Context, user string) ([]store.Mailbox, error) {
	if err := b.require(ctx); err != nil {
		return nil, err
	}
	return b.e.listMailboxes(ctx, b, user)
}

func (b *Batches) RenameMailbox(ctx context.Context, user, from, to string) error {
	if err := b.require(ctx); err != nil {
		return err
	}
	return b.e.renameMailbox(ctx, b, user, from, to)
}

func (b *Batches) DeleteMailbox(ctx context.Context, user, name string) error {
	if err := b.require(ctx); err != nil {
		return err
	}
	return b.e.deleteMailboxNamed(ctx, b, user, name)
}

func (b *Batches) SetSubscribed(ctx context.Context, user, name string, subscribed bool) error {
	if err := b.require(ctx); err != nil {
		return err
	}
	return b.e.setSubscribed(ctx, b, user, name, subscribed)
}

// bhead is a bmailboxes row: the mailbox as readers see it, and the epoch
// and counter n of the head's timestamp (zero for a mailbox no manager
// has adopted yet).
type bhead struct {
	store.Mailbox
	epoch   uint64
	n       int64
	written bool // the head columns were ever written
}

const bheadColumns = `address, name, special_use, subscribed, uidvalidity, epoch, uidnext, modseq, messages, size, expunge_floor, WRITETIME(uidnext)`

func scanBHead(id store.ID, scan func(...any) error) (bhead, error) {
	var h bhead
	var addr, name, special *string
	var sub *bool
	var uv, epoch, un, ms, n, sz, fl, wt *int64
	if err := scan(&addr, &name, &special, &sub, &uv, &epoch, &un, &ms, &n, &sz, &fl, &wt); err != nil {
		return h, err
	}
	if addr == nil {
		return h, gocql.ErrNotFound
	}
	h.ID, h.User, h.Name = id, *addr, deref(name)
	h.SpecialUse, h.Subscribed = deref(special), sub != nil && *sub
	h.UIDValidity = uint32(deref(uv))
	h.UIDNext, h.HighestModSeq = 1, 1
	if un != nil {
		h.written = true
		h.epoch = uint64(deref(epoch))
		h.UIDNext, h.HighestModSeq = uint32(*un), uint64(deref(ms))
		h.Messages, h.Size, h.ExpungeFloor = uint32(deref(n)), deref(sz), uint64(deref(fl))
		if wt != nil {
			h.n = *wt - base(h.epoch)
		}
	}
	return h, nil
}

// readHead reads a mailbox's record at the read consistency, or with
// strong at the serial consistency, the strongest the engine has (an
// adoption's read). Both see every head write acknowledged at the write
// consistency as long as R + W > RF (docs/cassandra.md).
func (b *Batches) readHead(ctx context.Context, id store.ID, strong bool) (bhead, error) {
	if err := b.require(ctx); err != nil {
		return bhead{}, err
	}
	stmt := `SELECT ` + bheadColumns + ` FROM bmailboxes WHERE id = ?`
	q := b.e.read(ctx, stmt, id[:])
	if strong {
		q = b.e.serialRead(ctx, stmt, id[:])
	}
	h, err := scanBHead(id, q.Scan)
	if err != nil {
		return h, wrap("mailbox "+id.String(), err)
	}
	return h, nil
}

// deleteMailbox releases every message's blob, then removes the name and
// every row of the mailbox at tsForever, above any epoch's timestamp: a
// mailbox ID is never reused, and nothing of it may reappear, however
// late a write of it arrives. Run again after an interruption, it finishes
// the job. The caller (the user manager) has drained the user's batches.
func (b *Batches) deleteMailbox(ctx context.Context, m store.Mailbox) error {
	e := b.e
	h, err := b.readHead(ctx, m.ID, true)
	if err != nil {
		return err
	}
	b.forget(m.ID)
	b.gc.forget(m.ID)
	// Every message row, present or expunged and not yet collected, up
	// to the last UID any writer may have used.
	last := bucketOf(uint64(h.UIDNext) + window)
	for bk := 0; bk <= last; bk++ {
		it := e.read(ctx, `SELECT uid, modseq, blob FROM bmessages WHERE mailbox = ? AND bucket = ?`,
			m.ID[:], bk).PageSize(1000).Iter()
		type ref struct {
			uid  int64
			blob store.ID
		}
		var refs []ref
		var uid, modseq int64
		var raw []byte
		for it.Scan(&uid, &modseq, &raw) {
			if modseq != 0 {
				continue
			}
			var id store.ID
			copy(id[:], raw)
			refs = append(refs, ref{uid, id})
		}
		if err := it.Close(); err != nil {
			return wrap("listing messages", err)
		}
		for _, r := range refs {
			if r.blob.IsZero() {
				continue
			}
			if err := e.write(ctx, `DELETE FROM blob_refs USING TIMESTAMP ? WHERE id = ? AND mailbox = ? AND uid = ?`,
				tsForever, r.blob[:], m.ID[:], r.uid).Exec(); err != nil {
				return wrap("deleting blob reference", err)
			}
			if err := b.gc.release(ctx, r.blob, m.ID, r.uid); err != nil {
				return err
			}
		}
	}
	if _, err := e.cas(ctx, `DELETE FROM mailbox_names WHERE address = ? AND name = ? IF id = ?`,
		m.User, h.Name, m.ID[:]).MapScanCAS(map[string]any{}); err != nil {
		return wrap("unnaming mailbox", err)
	}
	for bk := 0; bk <= bucketOf(h.HighestModSeq+window); bk++ {
		if err := e.write(ctx, `DELETE FROM bchanges USING TIMESTAMP ? WHERE mailbox = ? AND bucket = ?`, tsForever, m.ID[:], bk).Exec(); err != nil {
			return wrap("deleting change log", err)
		}
	}
	for bk := 0; bk <= last; bk++ {
		if err := e.write(ctx, `DELETE FROM bmessages USING TIMESTAMP ? WHERE mailbox = ? AND bucket = ?`, tsForever, m.ID[:], bk).Exec(); err != nil {
			return wrap("deleting messages", err)
		}
	}
	return wrap("deleting mailbox", e.write(ctx, `DELETE FROM bmailboxes USING TIMESTAMP ? WHERE id = ?`, tsForever, m.ID[:]).Exec())
}

// timeout bounds a background request of the view.
func (b *Batches) timeout() time.Duration { return b.e.opts.Timeout }
