package cassandra

import (
	"context"
	"fmt"

	"quill/internal/store"
)

// Check implements store.Engine for the batch mode. It first waits for
// this process's collector to finish what it has queued (up to a minute),
// then verifies, as readers see them:
//   - each mailbox name points at a mailbox of that user and name;
//   - each mailbox has as many messages, of as many bytes, as its head
//     says, every UID below UIDNEXT, every MODSEQ at most HIGHESTMODSEQ,
//     added MODSEQs that never decrease as UIDs increase (Changes derives
//     additions from them, batchadded.go), each present message's latest
//     flag version in the change log, no
//     expunge entry at or below the expunge floor, the floor at most
//     HIGHESTMODSEQ, and no version left that the collector should have
//     deleted (a superseded version, an expunged message);
//   - each blob reference matches a message, each message's blob exists
//     and is held (owner or reference), each blob is held or pending, and
//     no blob is doomed.
//
// It reads whole tables: an operator's tool, not for a busy cluster.
func (b *Batches) Check(ctx context.Context) ([]string, error) {
	if err := b.require(ctx); err != nil {
		return nil, err
	}
	wctx, cancel := context.WithTimeout(ctx, gcWait)
	err := b.gc.drain(wctx)
	cancel()
	var problems []string
	report := func(format string, args ...any) { problems = append(problems, fmt.Sprintf(format, args...)) }
	if err != nil {
		report("the collector did not finish within %s: %v", gcWait, err)
	}
	e := b.e

	heads := map[store.ID]bhead{}
	it := e.read(ctx, `SELECT id, `+bheadColumns+` FROM bmailboxes`).PageSize(500).Iter()
	for {
		var raw []byte
		ok := true
		h, err := scanBHead(store.ID{}, func(dest ...any) error {
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
	present := map[ref]store.ID{} // message -> its blob
	for id, h := range heads {
		var count, size int64
		var prevUID uint32
		var prevAdded uint64
		for bk := 0; int64(bk)<<bucketBits < int64(h.UIDNext); bk++ {
			from := int64(bk) << bucketBits
			for {
				rows, more, err := b.readRange(ctx, id, bk, from, int64(bk+1)<<bucketBits, 1000)
				if err != nil {
					return nil, err
				}
				msgs, err := b.resolve(ctx, id, h, rows)
				if err != nil {
					return nil, fmt.Errorf("mailbox %s: %w", id, err)
				}
				added := map[uint32]uint64{}
				for _, r := range rows {
					switch {
					case !r.present:
						report("mailbox %s: UID %d has versions without its message row", id, r.msg.UID)
					case r.msg.UID < h.UIDNext:
						added[r.msg.UID] = r.msg.ModSeq
						if r.msg.ModSeq < prevAdded {
							report("mailbox %s: UID %d added at MODSEQ %d, before UID %d at %d", id, r.msg.UID, r.msg.ModSeq, prevUID, prevAdded)
						}
						prevUID, prevAdded = r.msg.UID, r.msg.ModSeq
					}
				}
				latest := map[uint32]store.Message{}
				for _, m := range msgs {
					latest[m.UID] = m
					count++
					size += m.Size
					present[ref{id, m.UID}] = m.Blob
					if m.ModSeq > h.HighestModSeq {
						report("mailbox %s: UID %d MODSEQ %d above HIGHESTMODSEQ %d", id, m.UID, m.ModSeq, h.HighestModSeq)
					}
					if m.ModSeq == added[m.UID] {
						continue // an addition has no entry
					}
					var kind int8
					if err := e.read(ctx, `SELECT kind FROM bchanges WHERE mailbox = ? AND bucket = ? AND section = 0 AND modseq = ? AND uid = ?`,
						id[:], bucketOf(m.ModSeq), int64(m.ModSeq), int64(m.UID)).Scan(&kind); err != nil {
						report("mailbox %s: UID %d has no change log entry at MODSEQ %d (%v)", id, m.UID, m.ModSeq, err)
					}
				}
				for _, r := range rows {
					if !r.present || r.msg.UID >= h.UIDNext {
						continue
					}
					m, ok := latest[r.msg.UID]
					switch {
					case !ok:
						report("mailbox %s: expunged UID %d not collected", id, r.msg.UID)
					case len(r.versions) > 0 && r.versions[0].modseq < m.ModSeq:
						report("mailbox %s: UID %d: superseded version at MODSEQ %d not collected", id, r.msg.UID, r.versions[0].modseq)
					}
				}
				if !more || len(rows) == 0 {
					break
				}
				from = int64(rows[len(rows)-1].msg.UID) + 1
			}
		}
		if count != int64(h.Messages) || size != h.Size {
			report("mailbox %s: head says %d messages, %d bytes; rows %d, %d", id, h.Messages, h.Size, count, size)
		}
		if h.ExpungeFloor > h.HighestModSeq {
			report("mailbox %s: expunge floor %d above HIGHESTMODSEQ %d", id, h.ExpungeFloor, h.HighestModSeq)
		}
		for bk := 0; h.ExpungeFloor > 0 && bk <= bucketOf(h.ExpungeFloor); bk++ {
			var ms, uid int64
			err := e.read(ctx, `SELECT modseq, uid FROM bchanges WHERE mailbox = ? AND bucket = ? AND section = 1 AND modseq <= ? LIMIT 1`,
				id[:], bk, int64(h.ExpungeFloor)).Scan(&ms, &uid)
			if err == nil {
				report("mailbox %s: expunge of UID %d at MODSEQ %d, at or below the expunge floor %d", id, uid, ms, h.ExpungeFloor)
			} else if !isDriverNotFound(err) {
				return nil, wrap("scanning change log", err)
			}
		}
	}

	held := map[store.ID]bool{}
	holds, err := e.pendingHolds(ctx)
	if err != nil {
		return nil, err
	}
	it = e.read(ctx, `SELECT id, mailbox, uid FROM blob_refs`).PageSize(1000).Iter()
	var braw, mraw []byte
	var uid int64
	for it.Scan(&braw, &mraw, &uid) {
		var bl, m store.ID
		copy(bl[:], braw)
		copy(m[:], mraw)
		if m.IsZero() {
			report("blob %s: doomed and not deleted", bl)
			continue
		}
		held[bl] = true
		if holds[blobRef{bl, m, uid}] {
			continue // a pending delivery's (deliveries.go)
		}
		if got, ok := present[ref{m, uint32(uid)}]; !ok || got != bl {
			report("blob %s: reference from %s UID %d without such a message", bl, m, uid)
		}
	}
	if err := it.Close(); err != nil {
		return nil, wrap("scanning blob references", err)
	}
	pending := map[store.ID]bool{}
	it = e.read(ctx, `SELECT id FROM pending_blobs`).PageSize(1000).Iter()
	for it.Scan(&braw) {
		var bl store.ID
		copy(bl[:], braw)
		pending[bl] = true
	}
	if err := it.Close(); err != nil {
		return nil, wrap("scanning pending blobs", err)
	}
	blobs := map[store.ID]bool{}
	it = e.read(ctx, `SELECT id, size, chunks, data, owner, owner_uid FROM blobs`).PageSize(1000).Iter()
	var bsize int64
	var chunks int
	var data, owner []byte
	var ownerUID *int64
	for it.Scan(&braw, &bsize, &chunks, &data, &owner, &ownerUID) {
		var bl store.ID
		copy(bl[:], braw)
		blobs[bl] = true
		if data != nil {
			if chunks != 0 || int64(len(data)) != bsize {
				report("blob %s: %d bytes inline, %d chunks, size %d", bl, len(data), chunks, bsize)
			}
		} else if want := int((bsize + chunkSize - 1) / chunkSize); chunks != want {
			report("blob %s: %d chunks for %d bytes", bl, chunks, bsize)
		}
		if owner != nil && ownerUID != nil {
			var o store.ID
			copy(o[:], owner)
			if got, ok := present[ref{o, uint32(*ownerUID)}]; ok && got == bl {
				held[bl] = true
			}
		}
		if !held[bl] && !pending[bl] {
			report("blob %s: neither held nor pending", bl)
		}
	}
	if err := it.Close(); err != nil {
		return nil, wrap("scanning blobs", err)
	}
	for r, bl := range present {
		if !blobs[bl] {
			report("mailbox %s UID %d: blob %s missing", r.mailbox, r.uid, bl)
		}
	}
	return problems, nil
}
