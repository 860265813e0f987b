package cassandra

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"quill/internal/store"
)

func joinFlags(f []string) string { return strings.Join(f, " ") }

func splitFlags(s string) []string {
	if s == "" {
		return nil
	}
	return strings.Split(s, " ")
}

func (e *Engine) Append(ctx context.Context, mailbox store.ID, msgs []store.NewMessage, opts store.AppendOptions) ([]store.Message, error) {
	if len(msgs) == 0 {
		return nil, fmt.Errorf("%w: nothing to append", store.ErrInvalid)
	}
	if uint64(len(msgs)) > 1<<bucketBits {
		return nil, fmt.Errorf("%w: %d messages in one append", store.ErrInvalid, len(msgs))
	}
	prepared := make([]opMsg, len(msgs))
	var total int64
	checked := map[store.ID]bool{}
	var blobs []store.ID
	for i, nm := range msgs {
		flags, err := store.NormalizeFlags(nm.Flags)
		if err != nil {
			return nil, err
		}
		if err := nm.Check(); err != nil {
			return nil, err
		}
		if nm.Body != nil {
			// An inline body is stored first like any other; this engine
			// has no write that could carry it with the append.
			id, _, err := e.PutBlob(ctx, bytes.NewReader(nm.Body), int64(len(nm.Body)))
			if err != nil {
				return nil, err
			}
			nm.Blob = id
		}
		if !checked[nm.Blob] {
			checked[nm.Blob] = true
			blobs = append(blobs, nm.Blob)
		}
		prepared[i] = opMsg{Flags: flags, Date: nm.InternalDate.UTC().Truncate(time.Millisecond), Size: nm.Size, Blob: nm.Blob, Meta: nm.Meta}
		total += nm.Size
	}
	unclaim, err := e.claimBlobs(ctx, mailbox, blobs)
	if err != nil {
		return nil, err
	}
	o, err := e.mutate(ctx, mailbox, func(h head) (*op, error) {
		if h.uidNext+int64(len(msgs)) > 1<<32-1 {
			return nil, fmt.Errorf("%w: mailbox %s has run out of UIDs", store.ErrConflict, mailbox)
		}
		if opts.CheckQuota {
			u, err := e.GetUser(ctx, h.User)
			if err != nil {
				return nil, err
			}
			if u.QuotaBytes > 0 {
				usage, err := e.Usage(ctx, h.User)
				if err != nil {
					return nil, err
				}
				if usage.Bytes+total > u.QuotaBytes {
					return nil, fmt.Errorf("%w: %s", store.ErrOverQuota, h.User)
				}
			}
		}
		o := &op{Kind: opAppend, Msgs: slices.Clone(prepared)}
		for i := range o.Msgs {
			o.Msgs[i].UID = uint32(h.uidNext) + uint32(i)
		}
		o.After = counters{UIDNext: h.uidNext + int64(len(msgs)), Messages: h.messages + int64(len(msgs)), Size: h.size + total}
		return o, nil
	})
	if errors.Is(err, errAmbiguous) {
		// Committed, perhaps, and applied by a later roll-forward: the
		// claim keeps the blob until then (and beyond, a leak that Check
		// reports, rather than a message without its body).
		return nil, err
	}
	unclaim()
	if err != nil {
		return nil, err
	}
	out := make([]store.Message, len(o.Msgs))
	for i, m := range o.Msgs {
		out[i] = store.Message{UID: m.UID, ModSeq: o.ModSeq, Flags: m.Flags, InternalDate: m.Date, Size: m.Size, Blob: m.Blob, Meta: m.Meta}
	}
	return out, nil
}

const messageColumns = `uid, modseq, flags, internal_date, size, blob, meta`

func scanMessage(scan func(...any) bool) (store.Message, bool) {
	var m store.Message
	var uid, modseq int64
	var flags string
	var blob []byte
	if !scan(&uid, &modseq, &flags, &m.InternalDate, &m.Size, &blob, &m.Meta) {
		return m, false
	}
	m.UID, m.ModSeq, m.Flags = uint32(uid), uint64(modseq), splitFlags(flags)
	copy(m.Blob[:], blob)
	m.InternalDate = m.InternalDate.UTC()
	return m, true
}

// ListMessages reads the UID buckets in order, up to the head's UIDNEXT,
// and shows a pending operation whole (pending.go). Rows beyond limit are
// read for the messages a pending expunge removes, and cut after.
func (e *Engine) ListMessages(ctx context.Context, mailbox store.ID, from uint32, limit int) ([]store.Message, error) {
	h, err := e.readHead(ctx, mailbox, false)
	if err != nil {
		return nil, err
	}
	if from == 0 {
		from = 1
	}
	end := int64(h.UIDNext) // exclusive
	want := limit
	if h.pending != nil {
		want += len(h.pending.Msgs)
	}
	var out []store.Message
	for b := bucketOf(uint64(from)); int64(b)<<bucketBits < end && len(out) < want; b++ {
		it := e.read(ctx, `SELECT `+messageColumns+` FROM messages WHERE mailbox = ? AND bucket = ? AND uid >= ? AND uid < ? LIMIT ?`,
			mailbox[:], b, int64(from), end, want-len(out)).PageSize(500).Iter()
		for {
			m, ok := scanMessage(it.Scan)
			if !ok {
				break
			}
			out = append(out, m)
		}
		if err := it.Close(); err != nil {
			return nil, wrap("listing messages", err)
		}
	}
	if h.pending != nil {
		out = h.pending.overlay(out, from)
	}
	if len(out) > limit {
		out = out[:limit]
	}
	return out, nil
}

func (e *Engine) GetMessage(ctx context.Context, mailbox store.ID, uid uint32) (store.Message, error) {
	h, err := e.readHead(ctx, mailbox, false)
	if err != nil {
		return store.Message{}, err
	}
	if uid == 0 || uid >= h.UIDNext {
		return store.Message{}, fmt.Errorf("message %d: %w", uid, store.ErrNotFound)
	}
	it := e.read(ctx, `SELECT `+messageColumns+` FROM messages WHERE mailbox = ? AND bucket = ? AND uid = ?`,
		mailbox[:], bucketOf(uint64(uid)), int64(uid)).Iter()
	m, ok := scanMessage(it.Scan)
	if err := it.Close(); err != nil {
		return store.Message{}, wrap("reading message", err)
	}
	if h.pending != nil {
		m, ok = h.pending.message(m, ok, uid)
	}
	if !ok {
		return store.Message{}, fmt.Errorf("message %d: %w", uid, store.ErrNotFound)
	}
	return m, nil
}

// readMessages returns the existing messages among uids, by UID.
func (e *Engine) readMessages(ctx context.Context, mailbox store.ID, uids []uint32) (map[uint32]store.Message, error) {
	byBucket := map[int][]int64{}
	for _, u := range uids {
		b := bucketOf(uint64(u))
		byBucket[b] = append(byBucket[b], int64(u))
	}
	out := map[uint32]store.Message{}
	for b, list := range byBucket {
		for len(list) > 0 {
			n := min(len(list), 100)
			it := e.read(ctx, `SELECT `+messageColumns+` FROM messages WHERE mailbox = ? AND bucket = ? AND uid IN ?`,
				mailbox[:], b, list[:n]).PageSize(500).Iter()
			for {
				m, ok := scanMessage(it.Scan)
				if !ok {
					break
				}
				out[m.UID] = m
			}
			if err := it.Close(); err != nil {
				return nil, wrap("reading messages", err)
			}
			list = list[n:]
		}
	}
	return out, nil
}

func dedupUIDs(uids []uint32) []uint32 {
	s := slices.Clone(uids)
	slices.Sort(s)
	return slices.Compact(s)
}

func (e *Engine) SetFlags(ctx context.Context, mailbox store.ID, change store.FlagChange) (store.FlagResult, error) {
	flags, err := store.NormalizeFlags(change.Flags)
	if err != nil {
		return store.FlagResult{}, err
	}
	uids := dedupUIDs(change.UIDs)
	var res store.FlagResult
	o, err := e.mutate(ctx, mailbox, func(h head) (*op, error) {
		res = store.FlagResult{}
		cur, err := e.readMessages(ctx, mailbox, uids)
		if err != nil {
			return nil, err
		}
		o := &op{Kind: opFlags}
		for _, uid := range uids {
			m, ok := cur[uid]
			if !ok || uid >= h.UIDNext {
				continue
			}
			if change.UnchangedSince != 0 && m.ModSeq > change.UnchangedSince {
				res.Failed = append(res.Failed, uid)
				continue
			}
			if change.Op > store.FlagsRemove {
				return nil, fmt.Errorf("%w: flag operation %d", store.ErrInvalid, change.Op)
			}
			next := store.ApplyFlags(m.Flags, change.Op, flags)
			if slices.Equal(next, m.Flags) || (len(next) == 0 && len(m.Flags) == 0) {
				continue
			}
			o.Msgs = append(o.Msgs, opMsg{UID: uid, OldModSeq: m.ModSeq, Flags: next, Date: m.InternalDate, Size: m.Size, Blob: m.Blob})
		}
		if len(o.Msgs) == 0 {
			return nil, nil
		}
		o.After = counters{UIDNext: h.uidNext, Messages: h.messages, Size: h.size}
		return o, nil
	})
	if err != nil || o == nil {
		return res, err
	}
	for _, m := range o.Msgs {
		res.Changed = append(res.Changed, store.Message{UID: m.UID, ModSeq: o.ModSeq, Flags: m.Flags, InternalDate: m.Date, Size: m.Size, Blob: m.Blob})
	}
	return res, nil
}

func (e *Engine) Expunge(ctx context.Context, mailbox store.ID, uids []uint32) ([]uint32, uint64, error) {
	uids = dedupUIDs(uids)
	o, err := e.mutate(ctx, mailbox, func(h head) (*op, error) {
		cur, err := e.readMessages(ctx, mailbox, uids)
		if err != nil {
			return nil, err
		}
		o := &op{Kind: opExpunge}
		var size int64
		for _, uid := range uids {
			if m, ok := cur[uid]; ok && uid < h.UIDNext {
				o.Msgs = append(o.Msgs, opMsg{UID: uid, OldModSeq: m.ModSeq, Size: m.Size, Blob: m.Blob})
				size += m.Size
			}
		}
		if len(o.Msgs) == 0 {
			return nil, nil
		}
		o.After = counters{UIDNext: h.uidNext, Messages: h.messages - int64(len(o.Msgs)), Size: h.size - size}
		return o, nil
	})
	if err != nil {
		return nil, 0, err
	}
	if o == nil {
		h, err := e.readHead(ctx, mailbox, false)
		return nil, h.HighestModSeq, err
	}
	gone := make([]uint32, len(o.Msgs))
	for i, m := range o.Msgs {
		gone[i] = m.UID
	}
	return gone, o.ModSeq, nil
}

// Changes reads the MODSEQ buckets in order up to HIGHESTMODSEQ; the
// entries of a pending operation, the highest MODSEQ, come from its record
// (pending.go), not from its rows, which may be written in part. An
// expunge may delete rows at or below its new floor while the buckets are
// read; it raised the floor in the head first, so reading the head again
// after the rows tells whether the answer may be partial.
func (e *Engine) Changes(ctx context.Context, mailbox store.ID, since uint64, limit int) ([]store.Change, error) {
	h, err := e.readHead(ctx, mailbox, false)
	if err != nil {
		return nil, err
	}
	if since < h.ExpungeFloor {
		return nil, forgotten(mailbox, since, h.ExpungeFloor)
	}
	var out []store.Change
	upper := h.HighestModSeq
	if since >= upper {
		return nil, nil
	}
	for b := bucketOf(since + 1); uint64(b) <= upper>>bucketBits && len(out) < limit; b++ {
		it := e.read(ctx, `SELECT modseq, uid, kind FROM changes WHERE mailbox = ? AND bucket = ? AND modseq > ? AND modseq <= ? LIMIT ?`,
			mailbox[:], b, int64(since), int64(upper), limit-len(out)).PageSize(1000).Iter()
		var ms, uid int64
		var kind int8
		for it.Scan(&ms, &uid, &kind) {
			out = append(out, store.Change{ModSeq: uint64(ms), UID: uint32(uid), Kind: store.ChangeKind(kind)})
		}
		if err := it.Close(); err != nil {
			return nil, wrap("reading change log", err)
		}
	}
	if n := len(out); n > 0 && n >= limit {
		// The LIMIT may have cut the last MODSEQ's entries: finish it.
		last := out[n-1]
		it := e.read(ctx, `SELECT uid, kind FROM changes WHERE mailbox = ? AND bucket = ? AND modseq = ? AND uid > ?`,
			mailbox[:], bucketOf(last.ModSeq), int64(last.ModSeq), int64(last.UID)).PageSize(1000).Iter()
		var uid int64
		var kind int8
		for it.Scan(&uid, &kind) {
			out = append(out, store.Change{ModSeq: last.ModSeq, UID: uint32(uid), Kind: store.ChangeKind(kind)})
		}
		if err := it.Close(); err != nil {
			return nil, wrap("reading change log", err)
		}
	}
	if p := h.pending; p != nil && since < p.ModSeq && (len(out) < limit || out[len(out)-1].ModSeq == p.ModSeq) {
		out = slices.DeleteFunc(out, func(c store.Change) bool { return c.ModSeq == p.ModSeq })
		out = append(out, p.changes()...)
	}
	if h, err = e.readHead(ctx, mailbox, false); err != nil {
		return nil, err
	}
	if since < h.ExpungeFloor {
		return nil, forgotten(mailbox, since, h.ExpungeFloor)
	}
	return out, nil
}

func forgotten(mailbox store.ID, since, floor uint64) error {
	return fmt.Errorf("mailbox %s since %d: %w below %d", mailbox, since, store.ErrExpungesForgotten, floor)
}
