package embedded

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"

	"github.com/cockroachdb/pebble/v2"

	"quill/internal/store"
	"quill/internal/store/embedded/bodylog"
)

// Check verifies, on a consistent snapshot, that every counter agrees with
// the rows it summarizes and every reference resolves:
//   - each name index entry points at a mailbox record of that user and name;
//   - each mailbox's message count and size match its messages, every UID is
//     below UIDNEXT and every MODSEQ at most HIGHESTMODSEQ;
//   - each message has a change log entry at its MODSEQ, every entry
//     decodes, and no expunge entry lies at or below the mailbox's
//     ExpungeFloor;
//   - each blob's reference count equals the messages referencing it, and
//     its chunks add up to its size or its bytes lie within its log
//     segment;
//   - each log segment's index, in memory or in Pebble, lists exactly the
//     blobs that point into it, and its live bytes are theirs
//     (checkLogIndex);
//   - each user's usage equals the sum over its mailboxes;
//   - each mailbox listCache holds has exactly the message records the
//     database has (checkLists).
//
// The log cleaner waits for the check: a segment it deleted after the
// snapshot would look missing to the blobs the snapshot still shows in it.
func (e *Engine) Check(ctx context.Context) ([]string, error) {
	e.cleaning.Lock()
	defer e.cleaning.Unlock()
	if err := e.checkpoint("check"); err != nil {
		return nil, err
	}
	snap := e.db.NewSnapshot()
	defer snap.Close()
	var problems []string
	report := func(format string, args ...any) { problems = append(problems, fmt.Sprintf(format, args...)) }

	scan := func(prefix []byte, fn func(k, v []byte) error) error {
		it, err := snap.NewIter(&pebble.IterOptions{LowerBound: prefix, UpperBound: prefixEnd(prefix)})
		if err != nil {
			return err
		}
		defer it.Close()
		for it.First(); it.Valid(); it.Next() {
			if err := ctx.Err(); err != nil {
				return err
			}
			if err := fn(it.Key(), it.Value()); err != nil {
				return err
			}
		}
		return it.Error()
	}

	refs := map[store.ID]int64{}
	usage := map[string]store.Usage{}
	mailboxes := map[store.ID]store.Mailbox{}
	err := scan([]byte{tMailbox}, func(k, v []byte) error {
		m, err := decodeMailbox(v)
		if err != nil {
			report("mailbox %x: undecodable", k[1:])
			return nil
		}
		mailboxes[m.ID] = m
		return nil
	})
	if err != nil {
		return nil, err
	}
	err = scan([]byte{tName}, func(k, v []byte) error {
		user, name, _ := bytes.Cut(k[1:], []byte{0})
		var id store.ID
		copy(id[:], v)
		m, ok := mailboxes[id]
		if !ok {
			report("name %s/%s: points at missing mailbox %s", user, name, id)
		} else if m.User != string(user) || m.Name != string(name) {
			report("name %s/%s: mailbox %s is %s/%s", user, name, id, m.User, m.Name)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	for _, m := range mailboxes {
		var count uint32
		var size int64
		u := usage[m.User]
		err := scan(messagePrefix(m.ID), func(k, v []byte) error {
			uid := binary.BigEndian.Uint32(k[17:])
			msg, err := decodeMessage(uid, v)
			if err != nil {
				report("mailbox %s uid %d: undecodable", m.ID, uid)
				return nil
			}
			count++
			size += msg.Size
			refs[msg.Blob]++
			if uid >= m.UIDNext {
				report("mailbox %s: uid %d >= uidnext %d", m.ID, uid, m.UIDNext)
			}
			if msg.ModSeq > m.HighestModSeq {
				report("mailbox %s uid %d: modseq %d > highest %d", m.ID, uid, msg.ModSeq, m.HighestModSeq)
			}
			if _, closer, err := snap.Get(changeKey(m.ID, msg.ModSeq, uid)); err != nil {
				report("mailbox %s uid %d: no change log entry at modseq %d", m.ID, uid, msg.ModSeq)
			} else {
				closer.Close()
			}
			return nil
		})
		if err != nil {
			return nil, err
		}
		if m.ExpungeFloor > m.HighestModSeq {
			report("mailbox %s: expunge floor %d > highest %d", m.ID, m.ExpungeFloor, m.HighestModSeq)
		}
		err = scan(changePrefix(m.ID), func(k, v []byte) error {
			ms, uid := binary.BigEndian.Uint64(k[17:]), binary.BigEndian.Uint32(k[25:])
			if _, err := decodeChanges(nil, ms, uid, v); err != nil {
				report("mailbox %s uid %d: undecodable change log entry at modseq %d", m.ID, uid, ms)
			} else if ms <= m.ExpungeFloor && store.ChangeKind(v[0]) == store.ChangeExpunged {
				report("mailbox %s uid %d: expunge at modseq %d kept below the floor %d", m.ID, uid, ms, m.ExpungeFloor)
			}
			return nil
		})
		if err != nil {
			return nil, err
		}
		if count != m.Messages || size != m.Size {
			report("mailbox %s (%s/%s): counters say %d messages/%d bytes, contents %d/%d",
				m.ID, m.User, m.Name, m.Messages, m.Size, count, size)
		}
		u.Bytes += size
		u.Messages += int64(count)
		usage[m.User] = u
	}
	err = scan([]byte{tBlob}, func(k, v []byte) error {
		var id store.ID
		copy(id[:], k[1:])
		rec, err := decodeBlob(v)
		if err != nil {
			report("blob %s: undecodable", id)
			return nil
		}
		pending := false
		if _, closer, err := snap.Get(pendingKey(id)); err == nil {
			closer.Close()
			pending = true
		}
		if rec.Refs != refs[id] && !(pending && rec.Refs == 0 && refs[id] == 0) {
			report("blob %s: refcount %d, referenced by %d messages", id, rec.Refs, refs[id])
		}
		delete(refs, id)
		if rec.Seg != 0 {
			checkLogged(e.blog, id, rec, report)
			return nil
		}
		var size int64
		var chunks uint32
		if err := scan(chunkPrefix(id), func(_, v []byte) error {
			size += int64(len(v))
			chunks++
			return nil
		}); err != nil {
			return err
		}
		if size != rec.Size || chunks != rec.Chunks {
			report("blob %s: record says %d bytes in %d chunks, found %d in %d", id, rec.Size, rec.Chunks, size, chunks)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	for id, n := range refs {
		report("blob %s: missing, referenced by %d messages", id, n)
	}
	err = scan([]byte{tUser}, func(k, _ []byte) error {
		user := string(k[1:])
		want := usage[user]
		delete(usage, user)
		v, closer, err := snap.Get(usageKey(user))
		var got store.Usage
		if err == nil {
			got, err = decodeUsage(v)
			closer.Close()
			if err != nil {
				report("usage of %s: undecodable", user)
				return nil
			}
		}
		if got != want {
			report("usage of %s: recorded %+v, contents %+v", user, got, want)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	for user := range usage {
		report("mailboxes of %s: no such user", user)
	}
	if err := e.checkLists(ctx, report); err != nil {
		return nil, err
	}
	if err := e.checkLogIndex(ctx, report); err != nil {
		return nil, err
	}
	return problems, nil
}

// checkLists compares listCache with the database. It runs as a
// transaction, so that the committer holds still: each cached mailbox's
// records, with the writes of the group's earlier transactions laid over
// them, must be exactly the records the group's batch shows.
func (e *Engine) checkLists(ctx context.Context, report func(string, ...any)) error {
	var found []string
	err := e.update(ctx, func(t *txn) error {
		found = found[:0]
		for id, l := range e.lists.m {
			want := map[uint32]string{}
			for i, uid := range l.uids {
				want[uid] = string(l.vals[i])
			}
			for k, v := range t.messages {
				if mb, uid, ok := mailboxOfMessageKey([]byte(k)); ok && mb == id {
					if v == nil {
						delete(want, uid)
					} else {
						want[uid] = string(v)
					}
				}
			}
			err := t.scan(messagePrefix(id), func(k, v []byte) error {
				_, uid, _ := mailboxOfMessageKey(k)
				if w, ok := want[uid]; !ok {
					found = append(found, fmt.Sprintf("list cache of mailbox %s: lacks uid %d", id, uid))
				} else if w != string(v) {
					found = append(found, fmt.Sprintf("list cache of mailbox %s: uid %d differs", id, uid))
				}
				delete(want, uid)
				return nil
			})
			if err != nil {
				return err
			}
			for uid := range want {
				found = append(found, fmt.Sprintf("list cache of mailbox %s: holds uid %d, which the database does not", id, uid))
			}
		}
		return nil
	})
	for _, f := range found {
		report("%s", f)
	}
	return err
}

// checkLogIndex checks the segments' log indexes and live bytes against
// the blob records, in a transaction so that the committer changes neither
// meanwhile: the cleaner deletes a segment whose index lists no blob, so a
// blob missing from its segment's index would lose its body.
func (e *Engine) checkLogIndex(ctx context.Context, report func(string, ...any)) error {
	var found []string
	err := e.update(ctx, func(t *txn) error {
		found = found[:0]
		// Pebble and the group's earlier writes hold every blob record
		// once the overlay is applied, and the deltas of those writes
		// are not yet in the segments.
		if err := t.e.checkpoint("check"); err != nil {
			return err
		}
		in := map[store.ID]uint32{}
		live := map[uint32]int64{}
		frozen := map[uint32]bool{}
		// Neither the committer (running this) nor the cleaner (waiting
		// for Check) changes the segments meanwhile.
		for _, s := range e.blog.Segments() {
			ids, _ := e.blog.YoungBlobs(s.Seg)
			for _, id := range ids {
				in[id] = s.ID
			}
			live[s.ID] = s.Live
			frozen[s.ID] = s.Frozen
		}
		for _, d := range t.deltas {
			if d.Add {
				in[d.Blob] = d.Seg
				live[d.Seg] += d.Bytes
			} else {
				if in[d.Blob] == d.Seg {
					delete(in, d.Blob)
				}
				live[d.Seg] -= d.Bytes
			}
		}
		sizes := map[store.ID]int64{} // from the entries in Pebble
		err := t.scan([]byte{tLogged}, func(k, v []byte) error {
			seg := binary.BigEndian.Uint32(k[1:5])
			var id store.ID
			copy(id[:], k[5:])
			size, n := binary.Varint(v)
			if n <= 0 {
				found = append(found, fmt.Sprintf("log index entry %x: undecodable", k))
			}
			sizes[id] = size
			if !frozen[seg] {
				found = append(found, fmt.Sprintf("log index entry in Pebble for blob %s in young log segment %d", id, seg))
			}
			if old, ok := in[id]; ok {
				found = append(found, fmt.Sprintf("blob %s: listed by log segments %d and %d", id, old, seg))
			}
			in[id] = seg
			return nil
		})
		if err != nil {
			return err
		}
		sums := map[uint32]int64{}
		err = t.scan([]byte{tBlob}, func(k, v []byte) error {
			var id store.ID
			copy(id[:], k[1:])
			r, err := decodeBlob(v)
			if err != nil || r.Seg == 0 {
				return nil // reported by Check's scan
			}
			if seg, ok := in[id]; !ok || seg != r.Seg {
				found = append(found, fmt.Sprintf("blob %s: in log segment %d, which does not list it", id, r.Seg))
			}
			if size, ok := sizes[id]; ok && size != r.Size {
				found = append(found, fmt.Sprintf("blob %s: log index entry says %d bytes, record %d", id, size, r.Size))
			}
			delete(in, id)
			sums[r.Seg] += r.Size
			return nil
		})
		if err != nil {
			return err
		}
		for id, seg := range in {
			found = append(found, fmt.Sprintf("log segment %d lists blob %s, whose record does not point into it", seg, id))
		}
		for seg, n := range live {
			if n != sums[seg] {
				found = append(found, fmt.Sprintf("log segment %d: %d live bytes counted, its blobs hold %d", seg, n, sums[seg]))
			}
		}
		return nil
	})
	for _, f := range found {
		report("%s", f)
	}
	return err
}

// checkLogged checks that a blob stored in the log lies within its
// segment.
func checkLogged(l *bodylog.Log, id store.ID, rec blobRecord, report func(string, ...any)) {
	s, ok := l.Acquire(rec.Seg)
	if !ok {
		report("blob %s: log segment %d is missing", id, rec.Seg)
		return
	}
	defer l.Release(s)
	end := l.Info(s).Size
	if rec.Off < bodylog.HeaderLen || rec.Off+rec.Size > end {
		report("blob %s: bytes %d-%d outside log segment %d (%d bytes)", id, rec.Off, rec.Off+rec.Size, rec.Seg, end)
	}
}
