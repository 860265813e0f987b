// Package usermgr is the user manager (ADR 0023): the one ordered writer of
// the mailboxes of the users this node manages. It holds each active
// user's mailbox heads (UIDNEXT, HIGHESTMODSEQ) and quota usage in memory,
// assigns UIDs and MODSEQs, checks quotas, turns each append, flag change
// and expunge into a store.Batch that an engine applies as it is, and
// publishes a change event once a write is durable. Reads and the
// directory pass straight through to the engine.
//
// A single node is a cluster of one: it manages every user, so every
// write of the server goes through here.
//
// Invariants, per user:
//   - Writes are built and submitted one at a time (user.mu), and the
//     engine applies them in submission order (store.BatchWriter), so
//     UIDs and MODSEQs are strictly increasing in the order readers can
//     observe them.
//   - A UID or MODSEQ handed out is never handed out again: the in-memory
//     head only moves forward, and a reload from the store (after a failed
//     batch) keeps the higher of the two. A user whose batch failed is not
//     forgotten (evicted) before that reload: a batch whose outcome is
//     unknown (store.ErrOutcomeUnknown) may still be applied after the
//     store was read, and only the handed-out head covers its UIDs.
//   - A write that reads messages before changing them (flags, expunge)
//     first waits until every batch of the user in flight is durable, so
//     it reads the state its batch follows; the engine re-checks it (the
//     batch's assertions) and refuses a batch built on a stale read.
//   - Appends do not wait for one another: many of one user's appends are
//     in flight at once and share the engine's group commit.
package usermgr

import (
	"context"
	"errors"
	"fmt"
	"hash/maphash"
	"math"
	"math/rand/v2"
	"slices"
	"sync"

	"quill/internal/store"
)

// Notifier receives a change event after every durable write to a mailbox
// (mailbox.Hub implements it). Notify must not block.
type Notifier interface {
	Notify(mailbox store.ID)
}

// Owner says under which fencing epoch this node manages a user (ADR
// 0024): the cluster's ownership of the user's bucket.
type Owner interface {
	// Epoch returns the epoch, or an error when this node does not manage
	// user now. Epochs of one user never decrease.
	Epoch(user string) (uint64, error)
}

// soleOwner is the owner of a single node: it manages every user, at
// epoch 1, for good.
type soleOwner struct{}

func (soleOwner) Epoch(string) (uint64, error) { return 1, nil }

// Options configure a Manager.
type Options struct {
	// Owner, if set, decides which users this node manages and under
	// which epoch; nil means every user, at epoch 1 (a single node).
	Owner Owner
	// Notifier, if set, hears of every durable write.
	Notifier Notifier
	// MaxUsers bounds the users whose state is kept; idle users beyond
	// it are forgotten (their state is rebuilt from the store when next
	// written). Zero means 1<<20.
	MaxUsers int
}

// Manager is the user manager over an engine. It implements store.Store:
// the engine's methods, with the mailbox writes (Append, SetFlags,
// Expunge, DeleteMailbox, DeleteUser) ordered here. It is safe for
// concurrent use.
type Manager struct {
	store.Engine
	// w applies the batches. It is nil when the engine orders its own
	// writes (own: the Cassandra engine, until it implements
	// store.BatchWriter); the manager then passes the writes through and
	// only publishes events.
	w      store.BatchWriter
	own    store.Store
	adopt  store.Adopter // nil: heads are read with GetMailboxByID
	owner  Owner
	notify Notifier
	max    int
	seed   maphash.Seed

	mu sync.Mutex
	// Guarded by mu: users files every user kept by name; boxes files
	// each by the first mailbox of theirs loaded (user.first), extra by
	// the others, which more lists per user.
	users, boxes table
	extra        map[store.ID]*user
	more         map[*user][]*head

	// stripes guard the users' batches in flight (user.state), by the
	// hash of the name, and wake drain as a user's last one ends.
	stripes [64]stripe
}

type stripe struct {
	mu   sync.Mutex
	done sync.Cond // on mu; broadcast when a user's batches in flight end
}

var _ store.Store = (*Manager)(nil)

// New returns the manager of every user of e, which must apply batches
// (store.BatchWriter) or order its own writes (store.Store).
func New(e store.Engine, opts Options) *Manager {
	m := newManager(opts.Owner, opts.MaxUsers)
	m.Engine, m.notify = e, opts.Notifier
	m.adopt, _ = e.(store.Adopter)
	if w, ok := e.(store.BatchWriter); ok {
		m.w = w
	} else if own, ok := e.(store.Store); ok {
		m.own = own
	} else {
		panic(fmt.Sprintf("usermgr: engine %T neither applies batches nor orders its writes", e))
	}
	return m
}

// newManager returns a Manager with its state and no engine.
func newManager(owner Owner, maxUsers int) *Manager {
	m := &Manager{owner: owner, max: maxUsers, seed: maphash.MakeSeed(),
		extra: map[store.ID]*user{}, more: map[*user][]*head{}}
	if m.owner == nil {
		m.owner = soleOwner{}
	}
	if m.max <= 0 {
		m.max = 1 << 20
	}
	m.users.key = func(u *user) uint64 { return m.hashName(u.name) }
	m.boxes.key = func(u *user) uint64 { return m.hashID(u.first.id) }
	for i := range m.stripes {
		m.stripes[i].done.L = &m.stripes[i].mu
	}
	return m
}

func (m *Manager) hashName(name string) uint64 { return maphash.String(m.seed, name) }
func (m *Manager) hashID(id store.ID) uint64   { return maphash.Comparable(m.seed, id) }

func (m *Manager) stripe(u *user) *stripe {
	return &m.stripes[m.hashName(u.name)%uint64(len(m.stripes))]
}

// user is the manager's state of one user. It is kept to 80 bytes (soft
// state per active user is a budget: BenchmarkSoftStatePerUser); what
// only some users need (more heads, a waiter) lives in the Manager.
type user struct {
	name string
	mu   sync.Mutex // orders the user's writes: held while one is built and submitted
	pins int32      // guarded by Manager.mu: goroutines holding or waiting for mu
	// state is guarded by the user's stripe: the batches submitted and
	// not yet finished, with failedBit once one failed (reload before the
	// next write).
	state uint32

	// Guarded by mu:
	epoch uint64 // the epoch heads were loaded under
	usage int64  // octets stored; noUsage until read
	// first is the head of the first mailbox loaded (a zero id: none);
	// the others' are in Manager.more. first.id changes only under
	// Manager.mu too, which reads it (Manager.boxes).
	first head
}

const (
	failedBit = 1 << 31
	noUsage   = math.MinInt64
)

// head is what the manager keeps of a mailbox: the next UID and MODSEQ to
// hand out, minus one for the MODSEQ.
type head struct {
	id      store.ID
	modSeq  uint64
	uidNext uint32
}

// find returns the head of mailbox id kept for u (whose mu is held), or
// nil.
func (m *Manager) find(u *user, id store.ID) *head {
	if u.first.id == id && !id.IsZero() {
		return &u.first
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, h := range m.more[u] {
		if h.id == id {
			return h
		}
	}
	return nil
}

// keep adds h, a head u (whose mu is held) does not have, and returns
// where it is kept.
func (m *Manager) keep(u *user, h head) *head {
	m.mu.Lock()
	defer m.mu.Unlock()
	if u.first.id.IsZero() {
		u.first = h
		m.boxes.add(u)
		return &u.first
	}
	p := &h
	m.more[u] = append(m.more[u], p)
	m.extra[h.id] = u
	return p
}

// heads returns u's heads (u's mu is held).
func (m *Manager) heads(u *user) []*head {
	m.mu.Lock()
	defer m.mu.Unlock()
	hs := slices.Clone(m.more[u])
	if !u.first.id.IsZero() {
		hs = append(hs, &u.first)
	}
	return hs
}

// drop forgets the head of mailbox id kept for u (whose mu is held).
func (m *Manager) drop(u *user, id store.ID) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if u.first.id == id && !id.IsZero() {
		m.boxes.remove(u)
		u.first = head{}
		return
	}
	more := slices.DeleteFunc(m.more[u], func(h *head) bool { return h.id == id })
	delete(m.extra, id)
	if len(more) == 0 {
		delete(m.more, u)
	} else {
		m.more[u] = more
	}
}

// dropAll forgets every head of u (whose mu is held).
func (m *Manager) dropAll(u *user) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.dropAllLocked(u)
	u.first = head{}
}

// dropAllLocked unfiles u's heads; m.mu is held.
func (m *Manager) dropAllLocked(u *user) {
	if !u.first.id.IsZero() {
		m.boxes.remove(u)
	}
	for _, h := range m.more[u] {
		delete(m.extra, h.id)
	}
	delete(m.more, u)
}

// lock returns name's state with its mu held, pinned against eviction
// until unlock.
func (m *Manager) lock(name string) *user {
	m.mu.Lock()
	u := m.userLocked(name)
	if u == nil {
		if m.users.n >= m.max {
			m.evictLocked()
		}
		u = &user{name: name, usage: noUsage}
		m.users.add(u)
	}
	u.pins++
	m.mu.Unlock()
	u.mu.Lock()
	return u
}

func (m *Manager) unlock(u *user) {
	u.mu.Unlock()
	m.mu.Lock()
	u.pins--
	m.mu.Unlock()
}

// evictLocked forgets some idle users (no one holds or waits for them,
// nothing in flight and no failed batch, whose handed-out heads the
// reload needs), from a random place on.
func (m *Manager) evictLocked() {
	var idle []*user
	m.users.each(rand.IntN(len(m.users.slots)), func(u *user) bool {
		if u.pins == 0 && m.settled(u) {
			idle = append(idle, u)
		}
		return len(idle) < 16
	})
	for _, u := range idle {
		m.users.remove(u)
		m.dropAllLocked(u)
	}
}

// settled reports whether u has no batch in flight and no failed one.
func (m *Manager) settled(u *user) bool {
	st := m.stripe(u)
	st.mu.Lock()
	defer st.mu.Unlock()
	return u.state == 0
}

// kept reports whether name's state is kept (for tests).
func (m *Manager) kept(name string) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.userLocked(name) != nil
}

// userLocked returns name's state if it is kept; m.mu is held.
func (m *Manager) userLocked(name string) *user {
	return m.users.find(m.hashName(name), func(u *user) bool { return u.name == name })
}

// Unwrap returns the engine beneath the manager, for the contracts an
// engine provides beside store.Engine (store.Secrets, store.Ownership).
func (m *Manager) Unwrap() store.Engine { return m.Engine }

// userOf returns the user owning mailbox: from the heads kept, or from
// the store.
func (m *Manager) userOf(ctx context.Context, mailbox store.ID) (string, error) {
	m.mu.Lock()
	u := m.boxes.find(m.hashID(mailbox), func(u *user) bool { return u.first.id == mailbox })
	if u == nil {
		u = m.extra[mailbox]
	}
	m.mu.Unlock()
	if u != nil {
		return u.name, nil
	}
	mb, err := m.Engine.GetMailboxByID(ctx, mailbox)
	if err != nil {
		return "", err
	}
	return mb.User, nil
}

// drain waits until none of u's batches is in flight, and reloads u's
// state if one of them failed. u.mu is held, so no new one starts.
func (m *Manager) drain(ctx context.Context, u *user) error {
	st := m.stripe(u)
	st.mu.Lock()
	for u.state&^failedBit != 0 {
		st.done.Wait()
	}
	failed := u.state&failedBit != 0
	u.state = 0
	st.mu.Unlock()
	if failed {
		return m.reload(ctx, u)
	}
	return nil
}

// failed reports whether one of u's batches failed since the last reload.
func (m *Manager) failed(u *user) bool {
	st := m.stripe(u)
	st.mu.Lock()
	defer st.mu.Unlock()
	return u.state&failedBit != 0
}

// reload rereads u's heads after a failed batch, keeping the higher of the
// stored and handed-out values (a refused batch's UIDs are never reused,
// though nothing of them was written), and forgets its usage, which the
// next quota check rereads. This is also all that an unknown outcome
// (store.ErrOutcomeUnknown) calls for: whether or not the batch was
// applied, or is yet to be, the stored head never exceeds the handed-out
// one, and dropping the handed-out heads instead would hand the batch's
// UIDs out again if it lands after the store was read.
func (m *Manager) reload(ctx context.Context, u *user) error {
	u.usage = noUsage
	for _, h := range m.heads(u) {
		mb, err := m.Engine.GetMailboxByID(ctx, h.id)
		if errors.Is(err, store.ErrNotFound) {
			m.drop(u, h.id)
			continue
		}
		if err != nil {
			st := m.stripe(u)
			st.mu.Lock()
			u.state |= failedBit
			st.mu.Unlock()
			return err
		}
		h.uidNext = max(h.uidNext, mb.UIDNext)
		h.modSeq = max(h.modSeq, mb.HighestModSeq)
	}
	return nil
}

// head returns mailbox's head, loading it from the store when u has none.
// A head absent from u has no batch in flight (heads leave u only with u,
// or in reload, which drains first), so the stored one is current.
func (m *Manager) head(ctx context.Context, u *user, mailbox store.ID) (*head, error) {
	if m.failed(u) {
		if err := m.drain(ctx, u); err != nil {
			return nil, err
		}
	}
	epoch, err := m.owner.Epoch(u.name)
	if err != nil {
		return nil, err
	}
	if epoch != u.epoch {
		// Managed anew (or first seen): what u holds came from another
		// term; every head is adopted again under this one.
		if err := m.drain(ctx, u); err != nil {
			return nil, err
		}
		m.dropAll(u)
		u.usage = noUsage
		u.epoch = epoch
	}
	if h := m.find(u, mailbox); h != nil {
		return h, nil
	}
	var mb store.Mailbox
	if m.adopt != nil {
		mb, err = m.adopt.AdoptMailbox(ctx, mailbox, epoch)
	} else {
		mb, err = m.Engine.GetMailboxByID(ctx, mailbox)
	}
	if err != nil {
		return nil, fmt.Errorf("mailbox %s: %w", mailbox, err)
	}
	if mb.User != u.name {
		return nil, fmt.Errorf("mailbox %s: %w", mailbox, store.ErrNotFound)
	}
	return m.keep(u, head{id: mailbox, uidNext: mb.UIDNext, modSeq: mb.HighestModSeq}), nil
}

// submit queues b for u (whose mu is held) and returns the function that
// waits for it; finish must be called with its outcome.
func (m *Manager) submit(ctx context.Context, u *user, b *store.Batch) (func() error, error) {
	b.Epoch = u.epoch
	wait, err := m.w.SubmitBatch(ctx, b)
	if err != nil {
		return nil, err
	}
	st := m.stripe(u)
	st.mu.Lock()
	u.state++
	st.mu.Unlock()
	return wait, nil
}

// finish records the outcome of one of u's batches and publishes its
// change events: for a durable batch, and for one whose outcome is
// unknown, which may be visible (an event that finds nothing new costs a
// poll; a missing one leaves IDLE clients behind).
func (m *Manager) finish(u *user, err error, mailboxes ...store.ID) {
	st := m.stripe(u)
	st.mu.Lock()
	if err != nil {
		u.state |= failedBit
	}
	u.state--
	if u.state&^failedBit == 0 {
		st.done.Broadcast()
	}
	st.mu.Unlock()
	if err == nil || errors.Is(err, store.ErrOutcomeUnknown) {
		m.publish(mailboxes...)
	}
}

func (m *Manager) publish(mailboxes ...store.ID) {
	if m.notify == nil {
		return
	}
	for _, id := range mailboxes {
		m.notify.Notify(id)
	}
}

// quotaRoom checks that u may store total more octets (ErrOverQuota
// otherwise), loading u's usage when it is not known; known, if not nil,
// is the user's quota as the caller read it.
func (m *Manager) quotaRoom(ctx context.Context, u *user, total int64, known *int64) error {
	var quota int64
	if known != nil {
		quota = *known
	} else {
		usr, err := m.Engine.GetUser(ctx, u.name)
		if err != nil {
			return err
		}
		quota = usr.QuotaBytes
	}
	if quota <= 0 {
		return nil
	}
	if u.usage == noUsage {
		if err := m.drain(ctx, u); err != nil {
			return err
		}
		usage, err := m.Engine.Usage(ctx, u.name)
		if err != nil {
			return err
		}
		u.usage = usage.Bytes
	}
	if u.usage+total > quota {
		return fmt.Errorf("%w: %s", store.ErrOverQuota, u.name)
	}
	return nil
}

// KnownRoom answers, from the usage the manager keeps, whether user has
// room for size more octets under quota: usage below quota and usage plus
// size within it, as a delivery's check at RCPT time reads it. The usage
// counts the batches in flight. known is false when the manager does not
// keep the user's usage under its current term (not kept, not read since
// it was loaded or a batch failed, or not managed here now): the caller
// then reads the usage from the store. It never reads the store itself,
// nor keeps state for a user it did not have.
func (m *Manager) KnownRoom(user string, quota, size int64) (room, known bool) {
	m.mu.Lock()
	u := m.userLocked(user)
	if u != nil {
		u.pins++
	}
	m.mu.Unlock()
	if u == nil {
		return false, false
	}
	u.mu.Lock()
	defer m.unlock(u)
	if u.usage == noUsage || m.failed(u) {
		return false, false
	}
	if epoch, err := m.owner.Epoch(user); err != nil || epoch != u.epoch {
		return false, false
	}
	return u.usage < quota && u.usage+size <= quota, true
}

// addUsage accounts a submitted batch's usage change, if the usage is
// known.
func (u *user) addUsage(d store.Usage) {
	if u.usage != noUsage {
		u.usage += d.Bytes
	}
}

// Append implements store.Store: consecutive UIDs from the mailbox's
// UIDNEXT and one new MODSEQ, in one batch. It does not wait for the
// user's other appends in flight.
func (m *Manager) Append(ctx context.Context, mailbox store.ID, msgs []store.NewMessage, opts store.AppendOptions) ([]store.Message, error) {
	return m.append(ctx, mailbox, msgs, opts, nil)
}

// errSkipped: append's before hook found the append already applied.
var errSkipped = errors.New("usermgr: already applied")

// append is Append, with before (if not nil) run under the user's lock
// once the mailbox's head is loaded and before the UIDs are assigned:
// it may fail the append, or skip it (the append then fails with
// errSkipped, having submitted nothing).
func (m *Manager) append(ctx context.Context, mailbox store.ID, msgs []store.NewMessage, opts store.AppendOptions,
	before func(u *user, h *head) (skip bool, err error)) ([]store.Message, error) {
	if m.w == nil {
		out, err := m.own.Append(ctx, mailbox, msgs, opts)
		if err == nil || errors.Is(err, store.ErrOutcomeUnknown) {
			m.publish(mailbox)
		}
		return out, err
	}
	if len(msgs) == 0 {
		return nil, fmt.Errorf("%w: nothing to append", store.ErrInvalid)
	}
	b := &store.Batch{Added: make([]store.AddedMessage, len(msgs))}
	var total int64
	for i, nm := range msgs {
		flags, err := store.NormalizeFlags(nm.Flags)
		if err != nil {
			return nil, err
		}
		if err := nm.Check(); err != nil {
			return nil, err
		}
		msg := store.Message{Flags: flags, InternalDate: nm.InternalDate.UTC(), Size: nm.Size, Blob: nm.Blob, Meta: nm.Meta}
		if nm.Body != nil {
			msg.Blob = store.NewID()
		}
		b.Added[i] = store.AddedMessage{Mailbox: mailbox, Message: msg, Body: nm.Body, FreshBlob: nm.FreshBlob && nm.Body == nil}
		total += nm.Size
	}
	name, err := m.userOf(ctx, mailbox)
	if err != nil {
		return nil, fmt.Errorf("mailbox %s: %w", mailbox, err)
	}
	u := m.lock(name)
	h, err := m.head(ctx, u, mailbox)
	if err == nil && uint64(h.uidNext)+uint64(len(msgs)) > math.MaxUint32 {
		err = fmt.Errorf("%w: UID space of mailbox %s exhausted", store.ErrConflict, mailbox)
	}
	if err == nil && opts.CheckQuota {
		err = m.quotaRoom(ctx, u, total, opts.UserQuota)
	}
	if err == nil && before != nil {
		var skip bool
		if skip, err = before(u, h); err == nil && skip {
			err = errSkipped
		}
	}
	if err != nil {
		m.unlock(u)
		return nil, err
	}
	modseq := h.modSeq + 1
	out := make([]store.Message, len(msgs))
	for i := range b.Added {
		a := &b.Added[i]
		a.Message.UID, a.Message.ModSeq = h.uidNext+uint32(i), modseq
		out[i] = a.Message
	}
	b.User = name
	b.Heads = []store.HeadChange{{Mailbox: mailbox, UIDNext: h.uidNext + uint32(len(msgs)), HighestModSeq: modseq,
		Messages: int64(len(msgs)), Size: total}}
	b.Usage = store.Usage{Bytes: total, Messages: int64(len(msgs))}
	wait, err := m.submit(ctx, u, b)
	if err != nil {
		m.unlock(u)
		return nil, err
	}
	h.uidNext, h.modSeq = b.Heads[0].UIDNext, modseq
	u.addUsage(b.Usage)
	m.unlock(u)
	err = wait()
	m.finish(u, err, mailbox)
	if err != nil {
		return nil, err
	}
	return out, nil
}

// ApplyPending appends the message of the pending delivery p (ADR 0034)
// to its mailbox, as its delivery would have, unless an earlier attempt
// did; it reports whether one had. The caller deletes the record once it
// returns nil; ErrNotFound means the mailbox is gone (no other error
// wraps it).
//
// Exactly once: under the user's lock, once the mailbox is adopted under
// this node's epoch (so that nothing an earlier manager left above the
// head can appear later) and the user's batches in flight are done, a
// record marked with a UID whose message is there with the record's blob
// was applied. Otherwise the UID the append takes is marked in the record
// (pd.MarkPending) before the append is submitted. A message applied and
// then expunged before its record was deleted (the applier died between
// the two) is not found, and is applied again: a duplicate, never a loss.
// The quota is not checked: the message was accepted with a 250.
func (m *Manager) ApplyPending(ctx context.Context, pd store.PendingDeliveries, p store.PendingDelivery) (already bool, err error) {
	if m.w == nil {
		return false, fmt.Errorf("%w: pending deliveries need an engine that applies batches", store.ErrInvalid)
	}
	nm := store.NewMessage{Blob: p.Blob, Size: p.Size, Flags: p.Flags, InternalDate: p.InternalDate, Meta: p.Meta}
	_, err = m.append(ctx, p.Mailbox, []store.NewMessage{nm}, store.AppendOptions{}, func(u *user, h *head) (bool, error) {
		if err := m.drain(ctx, u); err != nil {
			return false, err
		}
		if p.UID != 0 {
			msg, err := m.Engine.GetMessage(ctx, p.Mailbox, p.UID)
			if err == nil && msg.Blob == p.Blob {
				return true, nil
			}
			if err != nil && !errors.Is(err, store.ErrNotFound) {
				return false, err
			}
		}
		return false, pd.MarkPending(ctx, p, h.uidNext)
	})
	switch {
	case errors.Is(err, errSkipped):
		return true, nil
	case errors.Is(err, store.ErrNotFound):
		// The mailbox, or (held by the record, so never) the blob.
		if _, merr := m.Engine.GetMailboxByID(ctx, p.Mailbox); !errors.Is(merr, store.ErrNotFound) {
			return false, fmt.Errorf("usermgr: applying a pending delivery to mailbox %s: %v", p.Mailbox, err)
		}
	}
	return false, err
}

// readMessages returns the present messages among uids (ascending), read
// from the store: point reads for a few, a listing for many.
func (m *Manager) readMessages(ctx context.Context, mailbox store.ID, uids []uint32) ([]store.Message, error) {
	var out []store.Message
	if len(uids) <= 16 {
		for _, uid := range uids {
			msg, err := m.Engine.GetMessage(ctx, mailbox, uid)
			if errors.Is(err, store.ErrNotFound) {
				continue
			}
			if err != nil {
				return nil, err
			}
			out = append(out, msg)
		}
		return out, nil
	}
	const page = 1000
	want := uids
	for from := uids[0]; len(want) > 0; {
		msgs, err := m.Engine.ListMessages(ctx, mailbox, from, page)
		if err != nil {
			return nil, err
		}
		for _, msg := range msgs {
			for len(want) > 0 && want[0] < msg.UID {
				want = want[1:]
			}
			if len(want) > 0 && want[0] == msg.UID {
				out = append(out, msg)
				want = want[1:]
			}
		}
		if len(msgs) < page || msgs[len(msgs)-1].UID == math.MaxUint32 {
			break
		}
		from = msgs[len(msgs)-1].UID + 1
	}
	return out, nil
}

// ascending returns uids sorted without duplicates.
func ascending(uids []uint32) []uint32 {
	if slices.IsSorted(uids) {
		return slices.Compact(slices.Clone(uids))
	}
	s := slices.Clone(uids)
	slices.Sort(s)
	return slices.Compact(s)
}

// SetFlags implements store.Store: every message whose flags change moves
// to one new MODSEQ.
func (m *Manager) SetFlags(ctx context.Context, mailbox store.ID, change store.FlagChange) (store.FlagResult, error) {
	if m.w == nil {
		res, err := m.own.SetFlags(ctx, mailbox, change)
		if err == nil && len(res.Changed) > 0 || errors.Is(err, store.ErrOutcomeUnknown) {
			m.publish(mailbox)
		}
		return res, err
	}
	if change.Op > store.FlagsRemove {
		return store.FlagResult{}, fmt.Errorf("%w: flag operation %d", store.ErrInvalid, change.Op)
	}
	flags, err := store.NormalizeFlags(change.Flags)
	if err != nil {
		return store.FlagResult{}, err
	}
	uids := ascending(change.UIDs)
	if len(uids) == 0 {
		return store.FlagResult{}, nil
	}
	name, err := m.userOf(ctx, mailbox)
	if err != nil {
		return store.FlagResult{}, fmt.Errorf("mailbox %s: %w", mailbox, err)
	}
	u := m.lock(name)
	var res store.FlagResult
	h, err := m.head(ctx, u, mailbox)
	if err == nil {
		err = m.drain(ctx, u)
	}
	var msgs []store.Message
	if err == nil {
		msgs, err = m.readMessages(ctx, mailbox, uids)
	}
	if err != nil {
		m.unlock(u)
		return res, err
	}
	modseq := h.modSeq + 1
	b := &store.Batch{User: name}
	for _, msg := range msgs {
		if change.UnchangedSince > 0 && msg.ModSeq > change.UnchangedSince {
			res.Failed = append(res.Failed, msg.UID)
			continue
		}
		next := store.ApplyFlags(msg.Flags, change.Op, flags)
		if slices.Equal(next, msg.Flags) {
			continue
		}
		b.Flagged = append(b.Flagged, store.FlagWrite{Mailbox: mailbox, UID: msg.UID, PrevModSeq: msg.ModSeq, ModSeq: modseq, Flags: next})
		msg.Flags, msg.ModSeq = next, modseq
		res.Changed = append(res.Changed, msg)
	}
	if len(b.Flagged) == 0 {
		m.unlock(u)
		return res, nil
	}
	b.Heads = []store.HeadChange{{Mailbox: mailbox, UIDNext: h.uidNext, HighestModSeq: modseq}}
	wait, err := m.submit(ctx, u, b)
	if err != nil {
		m.unlock(u)
		return store.FlagResult{}, err
	}
	h.modSeq = modseq
	m.unlock(u)
	err = wait()
	m.finish(u, err, mailbox)
	if err != nil {
		return store.FlagResult{}, err
	}
	return res, nil
}

// Expunge implements store.Store.
func (m *Manager) Expunge(ctx context.Context, mailbox store.ID, uids []uint32) ([]uint32, uint64, error) {
	if m.w == nil {
		gone, modseq, err := m.own.Expunge(ctx, mailbox, uids)
		if err == nil && len(gone) > 0 || errors.Is(err, store.ErrOutcomeUnknown) {
			m.publish(mailbox)
		}
		return gone, modseq, err
	}
	name, err := m.userOf(ctx, mailbox)
	if err != nil {
		return nil, 0, fmt.Errorf("mailbox %s: %w", mailbox, err)
	}
	u := m.lock(name)
	h, err := m.head(ctx, u, mailbox)
	if err == nil {
		err = m.drain(ctx, u)
	}
	var msgs []store.Message
	if err == nil && len(uids) > 0 {
		msgs, err = m.readMessages(ctx, mailbox, ascending(uids))
	}
	if err != nil {
		m.unlock(u)
		return nil, 0, err
	}
	if len(msgs) == 0 {
		modseq := h.modSeq
		m.unlock(u)
		return nil, modseq, nil
	}
	modseq := h.modSeq + 1
	x := store.ExpungeWrite{Mailbox: mailbox, ModSeq: modseq, Messages: make([]store.ExpungedMessage, len(msgs))}
	gone := make([]uint32, len(msgs))
	var bytes int64
	for i, msg := range msgs {
		x.Messages[i] = store.ExpungedMessage{UID: msg.UID, ModSeq: msg.ModSeq, Blob: msg.Blob}
		gone[i] = msg.UID
		bytes += msg.Size
	}
	b := &store.Batch{User: name, Expunged: []store.ExpungeWrite{x},
		Heads: []store.HeadChange{{Mailbox: mailbox, UIDNext: h.uidNext, HighestModSeq: modseq, Messages: -int64(len(msgs)), Size: -bytes}},
		Usage: store.Usage{Bytes: -bytes, Messages: -int64(len(msgs))}}
	wait, err := m.submit(ctx, u, b)
	if err != nil {
		m.unlock(u)
		return nil, 0, err
	}
	h.modSeq = modseq
	u.addUsage(b.Usage)
	m.unlock(u)
	err = wait()
	m.finish(u, err, mailbox)
	if err != nil {
		return nil, 0, err
	}
	return gone, modseq, nil
}

// DeleteMailbox implements store.Store: the engine deletes the mailbox
// once the user's writes in flight are durable, and the manager forgets
// it.
func (m *Manager) DeleteMailbox(ctx context.Context, user, name string) error {
	mb, err := m.Engine.GetMailbox(ctx, user, name)
	if err != nil {
		return err
	}
	u := m.lock(user)
	defer m.unlock(u)
	if err := m.drain(ctx, u); err != nil {
		return err
	}
	err = m.Engine.DeleteMailbox(ctx, user, name)
	m.drop(u, mb.ID)
	u.usage = noUsage
	if err == nil {
		m.publish(mb.ID)
	}
	return err
}

// DeleteUser implements store.Store: the engine deletes the user once its
// writes in flight are durable, and the manager forgets it.
func (m *Manager) DeleteUser(ctx context.Context, address string) error {
	mbs, _ := m.Engine.ListMailboxes(ctx, address)
	u := m.lock(address)
	defer m.unlock(u)
	if err := m.drain(ctx, u); err != nil {
		return err
	}
	err := m.Engine.DeleteUser(ctx, address)
	m.dropAll(u)
	u.usage = noUsage
	if err == nil {
		for _, mb := range mbs {
			m.publish(mb.ID)
		}
	}
	return err
}

// SetMeta implements store.MetaSetter when the engine does; otherwise it
// keeps nothing, which the contract allows (derived data, recomputed by the
// next reader). Meta changes no MODSEQ and no batch rewrites it (a batch's
// flag write keeps the record's Meta), so it needs no ordering here.
func (m *Manager) SetMeta(ctx context.Context, mailbox store.ID, metas map[uint32][]byte) error {
	if ms, ok := m.Engine.(store.MetaSetter); ok {
		return ms.SetMeta(ctx, mailbox, metas)
	}
	return nil
}

// Move moves the present messages among uids from mailbox from to mailbox
// to, both of one user (RFC 6851 MOVE; RENAME of INBOX), with their flags,
// internal dates and summaries, and returns the UIDs moved and the UIDs
// they got, pairwise. With an engine that applies batches, the additions
// and the expunge are one batch: no reader ever sees a message in both
// mailboxes or in neither, and a crash keeps one of the two. The user's
// usage does not change, so no quota is checked.
func (m *Manager) Move(ctx context.Context, from store.ID, uids []uint32, to store.ID) (src, dst []uint32, err error) {
	uids = ascending(uids)
	if len(uids) == 0 {
		return nil, nil, nil
	}
	name, err := m.userOf(ctx, from)
	if err != nil {
		return nil, nil, fmt.Errorf("mailbox %s: %w", from, err)
	}
	if m.w == nil {
		return m.moveOwn(ctx, from, uids, to)
	}
	u := m.lock(name)
	hf, err := m.head(ctx, u, from)
	var ht *head
	if err == nil {
		ht, err = m.head(ctx, u, to) // another user's mailbox is not found in u
	}
	if err == nil {
		err = m.drain(ctx, u)
	}
	var msgs []store.Message
	if err == nil {
		msgs, err = m.readMessages(ctx, from, uids)
	}
	if err == nil && uint64(ht.uidNext)+uint64(len(msgs)) > math.MaxUint32 {
		err = fmt.Errorf("%w: UID space of mailbox %s exhausted", store.ErrConflict, to)
	}
	if err != nil || len(msgs) == 0 {
		m.unlock(u)
		return nil, nil, err
	}
	// One MODSEQ for the expunge and, in the destination, one for the
	// additions; a move within one mailbox uses one for both.
	fromSeq := hf.modSeq + 1
	toSeq, toNext := ht.modSeq+1, ht.uidNext
	if from == to {
		toSeq = fromSeq
	}
	b := &store.Batch{User: name}
	x := store.ExpungeWrite{Mailbox: from, ModSeq: fromSeq, Messages: make([]store.ExpungedMessage, len(msgs))}
	src, dst = make([]uint32, len(msgs)), make([]uint32, len(msgs))
	var size int64
	for i, msg := range msgs {
		x.Messages[i] = store.ExpungedMessage{UID: msg.UID, ModSeq: msg.ModSeq, Blob: msg.Blob}
		src[i], dst[i] = msg.UID, toNext+uint32(i)
		moved := msg
		moved.UID, moved.ModSeq = dst[i], toSeq
		b.Added = append(b.Added, store.AddedMessage{Mailbox: to, Message: moved})
		size += msg.Size
	}
	b.Expunged = []store.ExpungeWrite{x}
	n := int64(len(msgs))
	if from == to {
		b.Heads = []store.HeadChange{{Mailbox: from, UIDNext: toNext + uint32(n), HighestModSeq: fromSeq}}
	} else {
		b.Heads = []store.HeadChange{
			{Mailbox: from, UIDNext: hf.uidNext, HighestModSeq: fromSeq, Messages: -n, Size: -size},
			{Mailbox: to, UIDNext: toNext + uint32(n), HighestModSeq: toSeq, Messages: n, Size: size},
		}
	}
	wait, err := m.submit(ctx, u, b)
	if err != nil {
		m.unlock(u)
		return nil, nil, err
	}
	hf.modSeq = fromSeq
	ht.modSeq, ht.uidNext = toSeq, toNext+uint32(n)
	m.unlock(u)
	err = wait()
	m.finish(u, err, from, to)
	if err != nil {
		return nil, nil, err
	}
	return src, dst, nil
}

// moveOwn is Move over an engine that orders its own writes: the copy
// first, then the expunge, so a failure between them leaves both copies,
// never none.
func (m *Manager) moveOwn(ctx context.Context, from store.ID, uids []uint32, to store.ID) (src, dst []uint32, err error) {
	msgs, err := m.readMessages(ctx, from, uids)
	if err != nil || len(msgs) == 0 {
		return nil, nil, err
	}
	nms := make([]store.NewMessage, len(msgs))
	for i, msg := range msgs {
		nms[i] = store.NewMessage{Blob: msg.Blob, Size: msg.Size, Flags: msg.Flags, InternalDate: msg.InternalDate, Meta: msg.Meta}
		src = append(src, msg.UID)
	}
	stored, err := m.Append(ctx, to, nms, store.AppendOptions{})
	if err != nil {
		return nil, nil, err
	}
	for _, msg := range stored {
		dst = append(dst, msg.UID)
	}
	if _, _, err := m.Expunge(ctx, from, src); err != nil {
		return nil, nil, err
	}
	return src, dst, nil
}
