package cassandra

import (
	"context"
	"fmt"

	"quill/internal/store"
)

// Check verifies that counters agree with the rows they summarize and that
// every reference resolves:
//   - each mailbox name points at a mailbox of that user and name;
//   - each mailbox without a pending operation has as many messages, of as
//     many bytes, as its counters say, every UID below UIDNEXT and every
//     MODSEQ at most HIGHESTMODSEQ, each message above the expunge floor a
//     change log entry at its MODSEQ, no change log entry at or below the
//     floor, and the floor at most HIGHESTMODSEQ;
//   - each blob reference matches a message, each referenced blob exists,
//     and each blob is referenced or pending.
//
// It reads whole tables: an operator's tool, not for a busy cluster.
func (e *Engine) Check(ctx context.Context) ([]string, error) {
	var problems []string
	report := func(format string, args ...any) { problems = append(problems, fmt.Sprintf(format, args...)) }

	heads := map[store.ID]head{}
	it := e.read(ctx, `SELECT id, `+headColumns+` FROM mailboxes`).PageSize(500).Iter()
	for {
		var raw []byte
		var h head
		var err error
		ok := true
		h, err = scanHead(store.ID{}, func(dest ...any) error {
			if !it.Scan(append([]any{&raw}, dest...)...) {
				ok = false
			}
			return nil
		})
		if !ok {
			break
		}
		var id store.ID
		copy(id[:], raw)
		if err != nil {
			report("mailbox %s: %v", id, err)
			continue
		}
		h.ID = id
		heads[id] = h
	}
	if err := it.Close(); err != nil {
		return nil, wrap("scanning mailboxes", err)
	}

	it = e.read(ctx, `SELECT address, name, id FROM mailbox_names`).PageSize(500).Iter()
	var addr, name string
	var raw []byte
	for it.Scan(&addr, &name, &raw) {
		var id store.ID
		copy(id[:], raw)
		h, ok := heads[id]
		switch {
		case !ok:
			report("name %s/%s: points at missing mailbox %s", addr, name, id)
		case h.User != addr || h.Name != name:
			report("name %s/%s: mailbox %s is %s/%s", addr, name, id, h.User, h.Name)
		}
	}
	if err := it.Close(); err != nil {
		return nil, wrap("scanning mailbox names", err)
	}

	type ref struct {
		mailbox store.ID
		uid     uint32
	}
	msgBlob := map[ref]store.ID{}
	blobRefs := map[store.ID]int{}
	for id, h := range heads {
		if h.pending != nil {
			continue // counters and rows are in flux; RollForward settles them
		}
		var count, size int64
		for b := 0; int64(b)<<bucketBits < h.uidNext; b++ {
			it := e.read(ctx, `SELECT `+messageColumns+` FROM messages WHERE mailbox = ? AND bucket = ?`, id[:], b).PageSize(500).Iter()
			for {
				m, ok := scanMessage(it.Scan)
				if !ok {
					break
				}
				count++
				size += m.Size
				if int64(m.UID) >= h.uidNext {
					report("mailbox %s: UID %d not below UIDNEXT %d", id, m.UID, h.uidNext)
				}
				if int64(m.ModSeq) > h.modSeq {
					report("mailbox %s: UID %d MODSEQ %d above HIGHESTMODSEQ %d", id, m.UID, m.ModSeq, h.modSeq)
				}
				var kind int8
				if int64(m.ModSeq) > h.floor {
					err := e.read(ctx, `SELECT kind FROM changes WHERE mailbox = ? AND bucket = ? AND modseq = ? AND uid = ?`,
						id[:], bucketOf(m.ModSeq), int64(m.ModSeq), int64(m.UID)).Scan(&kind)
					if err != nil {
						report("mailbox %s: UID %d has no change log entry at MODSEQ %d (%v)", id, m.UID, m.ModSeq, err)
					}
				}
				msgBlob[ref{id, m.UID}] = m.Blob
			}
			if err := it.Close(); err != nil {
				return nil, wrap("scanning messages", err)
			}
		}
		if h.floor > h.modSeq {
			report("mailbox %s: expunge floor %d above HIGHESTMODSEQ %d", id, h.floor, h.modSeq)
		}
		for b := 0; h.floor > 0 && b <= bucketOf(uint64(h.floor)); b++ {
			var ms, uid int64
			err := e.read(ctx, `SELECT modseq, uid FROM changes WHERE mailbox = ? AND bucket = ? AND modseq <= ? LIMIT 1`,
				id[:], b, h.floor).Scan(&ms, &uid)
			if err == nil {
				report("mailbox %s: change log entry of UID %d at MODSEQ %d, at or below the expunge floor %d", id, uid, ms, h.floor)
			} else if !isDriverNotFound(err) {
				return nil, wrap("scanning change log", err)
			}
		}
		if count != h.messages || size != h.size {
			report("mailbox %s: counters say %d messages, %d bytes; rows %d, %d", id, h.messages, h.size, count, size)
		}
	}

	holds, err := e.pendingHolds(ctx)
	if err != nil {
		return nil, err
	}
	it = e.read(ctx, `SELECT id, mailbox, uid FROM blob_refs`).PageSize(1000).Iter()
	var braw, mraw []byte
	var uid int64
	for it.Scan(&braw, &mraw, &uid) {
		var b, m store.ID
		copy(b[:], braw)
		copy(m[:], mraw)
		blobRefs[b]++
		if holds[blobRef{b, m, uid}] {
			continue // a pending delivery's (deliveries.go)
		}
		h, ok := heads[m]
		if ok && h.pending != nil {
			continue
		}
		if uid < 0 {
			// A claim (see blobs.go): an Append in flight, or one that
			// died or ended ambiguously; the blob is kept while it lasts.
			report("blob %s: claimed by an unfinished append to mailbox %s", b, m)
			continue
		}
		if got, ok := msgBlob[ref{m, uint32(uid)}]; !ok || got != b {
			report("blob %s: reference from %s UID %d without such a message", b, m, uid)
		}
	}
	if err := it.Close(); err != nil {
		return nil, wrap("scanning blob references", err)
	}
	for r, b := range msgBlob {
		if blobRefs[b] == 0 {
			report("mailbox %s UID %d: blob %s has no reference row", r.mailbox, r.uid, b)
		}
	}

	pending := map[store.ID]bool{}
	it = e.read(ctx, `SELECT id FROM pending_blobs`).PageSize(1000).Iter()
	for it.Scan(&braw) {
		var b store.ID
		copy(b[:], braw)
		pending[b] = true
	}
	if err := it.Close(); err != nil {
		return nil, wrap("scanning pending blobs", err)
	}
	blobs := map[store.ID]bool{}
	it = e.read(ctx, `SELECT id, size, chunks, data FROM blobs`).PageSize(1000).Iter()
	var bsize int64
	var chunks int
	var data []byte
	for it.Scan(&braw, &bsize, &chunks, &data) {
		var b store.ID
		copy(b[:], braw)
		blobs[b] = true
		if data != nil {
			if chunks != 0 || int64(len(data)) != bsize {
				report("blob %s: %d bytes inline, %d chunks, size %d", b, len(data), chunks, bsize)
			}
		} else if want := int((bsize + chunkSize - 1) / chunkSize); chunks != want {
			report("blob %s: %d chunks for %d bytes", b, chunks, bsize)
		}
		if blobRefs[b] == 0 && !pending[b] {
			report("blob %s: neither referenced nor pending", b)
		}
	}
	if err := it.Close(); err != nil {
		return nil, wrap("scanning blobs", err)
	}
	for b := range blobRefs {
		if !blobs[b] {
			report("blob %s: referenced but missing", b)
		}
	}
	return problems, nil
}
