package embedded

import (
	"context"
	"fmt"

	"quill/internal/store"
)

var _ store.BatchWriter = (*Engine)(nil)

// SubmitBatch implements store.BatchWriter. The batch becomes one
// transaction of the committer: it is grouped with whatever else is queued,
// made durable by the group's one fdatasync, and fenced like any write that
// reads a mailbox record for update, so readers see all of it or none.
// Transactions run in the order they were queued, which is the order
// BatchWriter promises.
func (e *Engine) SubmitBatch(ctx context.Context, b *store.Batch) (func() error, error) {
	if err := b.Validate(); err != nil {
		return nil, err
	}
	window := e.opts.ExpungeWindow
	r, err := e.submit(ctx, func(t *txn) error { return t.applyBatch(b, window) })
	if err != nil {
		return nil, err
	}
	return r.wait, nil
}

// applyBatch applies b's writes after checking its assertions against the
// records as the transaction sees them: every head belongs to b.User and
// moves forward, every added UID and every new MODSEQ lies above the
// stored head (so it was never visible), every rewritten or removed message
// is at the MODSEQ and blob the manager read. Any failure drops the whole
// transaction (txn rollback), so a refused batch writes nothing.
func (t *txn) applyBatch(b *store.Batch, window uint64) error {
	type head struct {
		m   store.Mailbox
		pre store.Mailbox // the stored head, before b
	}
	heads := make(map[store.ID]*head, len(b.Heads))
	for _, h := range b.Heads {
		m, err := t.mailbox(h.Mailbox)
		if err != nil {
			return fmt.Errorf("mailbox %s: %w", h.Mailbox, err)
		}
		if m.User != b.User {
			return fmt.Errorf("%w: batch of %s writes mailbox %s of %s", store.ErrConflict, b.User, m.ID, m.User)
		}
		if h.UIDNext < m.UIDNext || h.HighestModSeq < m.HighestModSeq {
			return fmt.Errorf("%w: mailbox %s: head (%d, %d) would move back to (%d, %d)",
				store.ErrConflict, m.ID, m.UIDNext, m.HighestModSeq, h.UIDNext, h.HighestModSeq)
		}
		msgs := int64(m.Messages) + h.Messages
		if msgs < 0 || msgs > int64(^uint32(0)) || m.Size+h.Size < 0 {
			return fmt.Errorf("%w: mailbox %s: counts %d+%d messages, %d+%d octets",
				store.ErrConflict, m.ID, m.Messages, h.Messages, m.Size, h.Size)
		}
		pre := m
		m.UIDNext, m.HighestModSeq = h.UIDNext, h.HighestModSeq
		m.Messages, m.Size = uint32(msgs), m.Size+h.Size
		heads[h.Mailbox] = &head{m: m, pre: pre}
	}
	fresh := func(mb store.ID, modseq uint64) error {
		if h := heads[mb]; modseq <= h.pre.HighestModSeq {
			return fmt.Errorf("%w: mailbox %s: MODSEQ %d not above %d", store.ErrConflict, mb, modseq, h.pre.HighestModSeq)
		}
		return nil
	}
	for _, a := range b.Added {
		msg := a.Message
		if h := heads[a.Mailbox]; msg.UID < h.pre.UIDNext {
			return fmt.Errorf("%w: mailbox %s: UID %d below UIDNEXT %d", store.ErrConflict, a.Mailbox, msg.UID, h.pre.UIDNext)
		}
		if err := fresh(a.Mailbox, msg.ModSeq); err != nil {
			return err
		}
		if a.Body != nil {
			t.putLogBlob(msg.Blob, a.Body, 1)
		} else if err := t.addBlobRef(msg.Blob, 1); err != nil {
			return err
		}
		t.insert(messageKey(a.Mailbox, msg.UID), encodeMessage(msg))
		t.insert(changeKey(a.Mailbox, msg.ModSeq, msg.UID), []byte{byte(store.ChangeAdded)})
	}
	for _, f := range b.Flagged {
		if err := fresh(f.Mailbox, f.ModSeq); err != nil {
			return err
		}
		msg, ok, err := t.message(f.Mailbox, f.UID)
		if err != nil {
			return err
		}
		if !ok || msg.ModSeq != f.PrevModSeq {
			return fmt.Errorf("%w: mailbox %s: message %d is not at MODSEQ %d", store.ErrConflict, f.Mailbox, f.UID, f.PrevModSeq)
		}
		t.del(changeKey(f.Mailbox, msg.ModSeq, f.UID))
		msg.Flags, msg.ModSeq = f.Flags, f.ModSeq
		t.set(messageKey(f.Mailbox, f.UID), encodeMessage(msg))
		t.insert(changeKey(f.Mailbox, f.ModSeq, f.UID), []byte{byte(store.ChangeFlags)})
	}
	for _, x := range b.Expunged {
		if len(x.Messages) == 0 {
			continue
		}
		if err := fresh(x.Mailbox, x.ModSeq); err != nil {
			return err
		}
		uids := make([]uint32, len(x.Messages))
		for i, em := range x.Messages {
			msg, ok, err := t.message(x.Mailbox, em.UID)
			if err != nil {
				return err
			}
			if !ok || msg.ModSeq != em.ModSeq || msg.Blob != em.Blob {
				return fmt.Errorf("%w: mailbox %s: message %d is not at MODSEQ %d", store.ErrConflict, x.Mailbox, em.UID, em.ModSeq)
			}
			if err := t.addBlobRef(msg.Blob, -1); err != nil {
				return err
			}
			t.del(messageKey(x.Mailbox, em.UID))
			t.del(changeKey(x.Mailbox, msg.ModSeq, em.UID))
			uids[i] = em.UID
		}
		for rest := uids; len(rest) > 0; {
			n := min(len(rest), maxExpungedPerEntry)
			t.insert(changeKey(x.Mailbox, x.ModSeq, rest[0]), encodeExpunged(rest[:n]))
			rest = rest[n:]
		}
		h := heads[x.Mailbox]
		if err := t.pruneExpunges(&h.m, window); err != nil {
			return err
		}
	}
	for _, h := range b.Heads {
		t.putMailbox(heads[h.Mailbox].m)
	}
	if b.Usage != (store.Usage{}) {
		return t.addUsage(b.User, b.Usage.Bytes, b.Usage.Messages)
	}
	return nil
}
