package embedded

import (
	"context"
	"encoding/binary"
	"fmt"
	"math"
	"slices"
	"sort"

	"quill/internal/store"
)

// ListMessages answers from listCache when it holds the mailbox. Otherwise
// it reads the mailbox record and the messages through one view of the
// overlay and Pebble (spanView), so both come from the same state. When the
// overlay holds none of the mailbox's messages and every present message
// fits in limit it walks Pebble's range downwards and stops once it has
// the record's count: the expunged messages' tombstones, which sit below
// the present ones until a compaction drops them, are never visited. Under
// POP3's retrieve-and-delete that walk was most of a login's cost.
//
// A mailbox whose committed record counts no message is answered without a
// view: that is where POP3 leaves a mailbox, and where listCache drops it.
// The record is read before any message, and a group's message records and
// its mailbox record become durable together, so no acknowledged message
// is missed; one of a group still being synced is hidden, as fences do.
func (e *Engine) ListMessages(ctx context.Context, mailbox store.ID, from uint32, limit int) ([]store.Message, error) {
	if uids, vals, ok := e.lists.list(mailbox, from, limit); ok {
		out := make([]store.Message, len(uids))
		for i, uid := range uids {
			m, err := decodeMessage(uid, vals[i])
			if err != nil {
				return nil, err
			}
			out[i] = m
		}
		if f, ok := e.fenced(mailbox); ok {
			out = clampMessages(out, f)
		}
		return out, nil
	}
	if v, err := e.getCommitted(mailboxKey(mailbox)); err == nil {
		if m, err := decodeMailbox(v); err == nil && m.Messages == 0 {
			return nil, nil
		}
	}
	p := messagePrefix(mailbox)
	v, mrec, err := e.spanView(boxSpan(mailbox), binary.BigEndian.AppendUint32(append([]byte(nil), p...), from), prefixEnd(p), nil, true)
	if err != nil {
		return nil, err
	}
	defer v.Close()
	present := -1 // unknown
	if mrec != nil {
		m, err := decodeMailbox(mrec)
		if err != nil {
			return nil, err
		}
		present = int(m.Messages)
	}
	var out []store.Message
	add := func(k, val []byte) error {
		m, err := decodeMessage(binary.BigEndian.Uint32(k[len(p):]), val)
		out = append(out, m)
		return err
	}
	if len(v.Writes()) == 0 && present >= 0 && present <= limit {
		// Never step past the last one needed: that Prev would walk the
		// tombstones below it.
		it := v.Iter()
		for ok := present > 0 && it.Last(); ok; ok = len(out) < present && it.Prev() {
			if err := add(it.Key(), it.Value()); err != nil {
				return nil, err
			}
		}
		slices.Reverse(out)
	} else {
		for ok := v.First(); ok && len(out) < limit; ok = v.Next() {
			if err := add(v.Key(), v.Value()); err != nil {
				return nil, err
			}
		}
	}
	if err := v.Error(); err != nil {
		return nil, err
	}
	if f, ok := e.fenced(mailbox); ok {
		out = clampMessages(out, f)
	}
	return out, nil
}

// clampMessages drops the messages appended by the group being synced. Flag
// changes of that group are not hidden: a reader may see one up to an fsync
// early, and an OS crash in that window loses only a change that was never
// acknowledged.
func clampMessages(msgs []store.Message, f store.Mailbox) []store.Message {
	n := sort.Search(len(msgs), func(i int) bool { return msgs[i].UID >= f.UIDNext })
	return msgs[:n]
}

func (e *Engine) GetMessage(ctx context.Context, mailbox store.ID, uid uint32) (store.Message, error) {
	v, known := e.lists.get(mailbox, uid)
	var err error
	if !known {
		v, err = e.read(messageKey(mailbox, uid))
	} else if v == nil {
		err = store.ErrNotFound
	}
	if err != nil {
		return store.Message{}, fmt.Errorf("message %d: %w", uid, err)
	}
	if f, ok := e.fenced(mailbox); ok && uid >= f.UIDNext {
		return store.Message{}, fmt.Errorf("message %d: %w", uid, store.ErrNotFound)
	}
	return decodeMessage(uid, v)
}

func (e *Engine) Changes(ctx context.Context, mailbox store.ID, since uint64, limit int) ([]store.Change, error) {
	p := changePrefix(mailbox)
	lower := binary.BigEndian.AppendUint64(append([]byte(nil), p...), since+1)
	if since == math.MaxUint64 {
		return nil, nil
	}
	it, _, err := e.spanView(boxSpan(mailbox), lower, prefixEnd(p), nil, false)
	if err != nil {
		return nil, err
	}
	defer it.Close()
	var out []store.Change
	for ok := it.First(); ok; ok = it.Next() {
		k := it.Key()[len(p):]
		if len(k) != 12 {
			return nil, errCorrupt
		}
		modseq := binary.BigEndian.Uint64(k)
		if n := len(out); n > 0 && n >= limit && modseq != out[n-1].ModSeq {
			break
		}
		if out, err = decodeChanges(out, modseq, binary.BigEndian.Uint32(k[8:]), it.Value()); err != nil {
			return nil, err
		}
	}
	if err := it.Error(); err != nil {
		return nil, err
	}
	// The floor is read after the iterator's snapshot, from the latest
	// state rather than the fenced one: a prune the iterator saw raised
	// it in the same batch, and it never goes down.
	v, err := e.read(mailboxKey(mailbox))
	if err != nil {
		return nil, fmt.Errorf("mailbox %s: %w", mailbox, err)
	}
	m, err := decodeMailbox(v)
	if err != nil {
		return nil, err
	}
	if since < m.ExpungeFloor {
		return nil, fmt.Errorf("mailbox %s since %d: %w below %d", mailbox, since, store.ErrExpungesForgotten, m.ExpungeFloor)
	}
	if f, ok := e.fenced(mailbox); ok {
		n := sort.Search(len(out), func(i int) bool { return out[i].ModSeq > f.HighestModSeq })
		out = out[:n]
	}
	return out, nil
}

// pruneBatch bounds the change log entries one prune reads, so that the
// first prune of a mailbox with a long history does not make one huge
// transaction; the next expunge carries on.
const pruneBatch = 4096

// pruneExpunges forgets m's expunges more than window MODSEQs old, once
// twice that many have accumulated, and raises m.ExpungeFloor to match
// (the caller writes m). Added and flag entries stay: they are each
// present message's latest change. The floor only ever lands on a MODSEQ
// all of whose entries were read, so every expunge above it survives.
//
// Without this the log keeps a tombstone for every message a mailbox ever
// held: under POP3's retrieve-and-delete, one per delivered message, for
// ever. Clients resynchronizing from below the floor are answered by
// comparing message lists (store.ErrExpungesForgotten).
func (t *txn) pruneExpunges(m *store.Mailbox, window uint64) error {
	if m.HighestModSeq < m.ExpungeFloor+2*window {
		return nil
	}
	to := m.HighestModSeq - window
	lo, hi := changeKey(m.ID, m.ExpungeFloor+1, 0), changeKey(m.ID, to+1, 0)
	it, _, err := t.e.spanView(boxSpan(m.ID), lo, hi, t.grouped, false)
	if err != nil {
		return err
	}
	defer it.Close()
	floor, read := to, 0
	valid := it.First()
	for ; valid; valid = it.Next() {
		k := it.Key()
		ms := binary.BigEndian.Uint64(k[1+len(m.ID):])
		if read >= pruneBatch && ms != floor {
			break
		}
		floor = ms
		read++
		if v := it.Value(); len(v) > 0 && store.ChangeKind(v[0]) == store.ChangeExpunged {
			t.del(append([]byte(nil), k...))
		}
	}
	if err := it.Error(); err != nil {
		return err
	}
	if !valid {
		floor = to
	}
	m.ExpungeFloor = floor
	return nil
}

// SetMeta implements store.MetaSetter. It rewrites only message records,
// through the committer like any write, and reads no mailbox record for
// update: it needs no fence, because a reader that sees the record before
// or after it differs only in Meta, which both describe the same body.
func (e *Engine) SetMeta(ctx context.Context, mailbox store.ID, metas map[uint32][]byte) error {
	return e.update(ctx, func(t *txn) error {
		for uid, meta := range metas {
			if len(meta) == 0 {
				continue
			}
			msg, ok, err := t.message(mailbox, uid)
			if err != nil {
				return err
			}
			if !ok || len(msg.Meta) > 0 {
				continue
			}
			msg.Meta = meta
			t.set(messageKey(mailbox, uid), encodeMessage(msg))
		}
		return nil
	})
}
