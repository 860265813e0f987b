package embedded

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"

	"quill/internal/store"
)

// The body log is the engine's write-ahead log: Pebble runs with its own WAL
// disabled, and every commit group is one record appended to the log and
// synced before the group's batch is applied to Pebble's memtable. A record
// carries the group's message bodies followed by the batch (Batch.Repr), so
// a body costs one sequential write and shares its group's one fdatasync,
// and it is never rewritten by Pebble's compactions: the LSM holds only a
// small record that locates it (blobRecord.Seg, Off).
//
// Layout. The log is a directory of segment files named by a decimal
// sequence number, each at most about segmentBytes. A segment starts with a
// header:
//
//	magic "QLG2" | prevEnd uint64 | crc32c(id, magic, prevEnd) uint32
//
// where id is the segment's number (uint32) and prevEnd is the valid length
// of the segment before it, and then holds records:
//
//	payloadLen uint32 | crc32c(id, payload) uint32 | payload:
//	    bodiesLen uint32 | bodies | batch repr
//
// All integers are little-endian. Each batch also sets the logPos key to
// the position (segment, offset) of its own record, so Pebble's persisted
// state names the last record it contains. Segments written before
// segments were reused have the magic "QLG1" and checksums without the id.
//
// Recovery. At open every record after the persisted logPos is applied
// again, in order. A record that is short or fails its CRC ends the last
// segment (a torn write that was never acknowledged: records are
// acknowledged only after their sync); writing resumes in a new segment
// whose header records where the old one ended, so that a later recovery
// can tell that end from corruption, which anywhere else is an error.
//
// Reuse. A deleted segment's file is kept (renamed NNN.free, at most
// spareSegments of them) and becomes a later segment, overwritten in place:
// an fdatasync of a write within the file's allocated, written length
// flushes only data, where an append must also commit the file system's
// journal (the new length and blocks), which doubled the sync's time here
// (docs/adr/0009). Because the checksums cover the segment's id, what the
// file held before, header or records, fails them and ends the segment as a
// torn tail would.
//
// Space. A segment can be deleted once Pebble holds all of its records in
// tables (a flush finished after the segment was sealed) and no blob
// record points into it. The engine counts each segment's live bytes in
// memory, and keeps its log index, the blobs whose records point into it:
//   - in memory (segment.blobs) while the segment is young: the committer
//     keeps it with every group it commits, and opening the store rebuilds
//     it from the blob records (countLive). Most bodies die young under
//     mail's retrieve-and-delete pattern, and so never touch Pebble.
//   - in Pebble ('g' segment, blob -> size) once it is frozen: while the
//     young segments list more than LogIndexBlobs blobs, the oldest is
//     frozen, one transaction writing the entries of the blobs still in
//     it; later transactions delete an entry with its blob or its move.
//     Memory thus holds a bounded index, however much mail the store
//     keeps, and a store whose live mail fits the bound (most, at 2 Mi
//     bodies) writes no index entry at all.
//
// Every body is written into the current segment in the log record that
// also writes its blob record, so a sealed segment never gains a blob. The
// cleaner copies the live bodies of sealed segments forward into the
// current segment, through the committer (cleanPlan says which and when),
// and deletes a segment once its index is empty. Readers hold a reference on the segment
// they read, so a deleted segment's file is closed only after its last
// reader.

const (
	segMagic     = "QLG2"
	segMagicV1   = "QLG1" // no id in the checksums
	segHeaderLen = 16
	recHeaderLen = 12
	// maxRecord bounds a record's length at recovery: a larger length can
	// only be garbage (a group is at most MaxGroup inline bodies).
	maxRecord = 1 << 30
	// defaultSegmentBytes is the size at which the log moves to a new
	// segment: large enough that rotations (a file creation and a
	// directory sync) are rare, small enough that one segment's garbage is
	// a modest share of the disk.
	defaultSegmentBytes = 64 << 20
	// cleanAfterSegments is how many reclaimable segments may wait for a
	// flush before the cleaner forces one: forcing one per segment would
	// multiply Pebble's flushes.
	cleanAfterSegments = 4
	// logIndexBlobs is Options.LogIndexBlobs's default: at 4 KiB a body,
	// the newest 8 GiB of live mail.
	logIndexBlobs = 2 << 20
	// spareSegments bounds the deleted segments kept for reuse: enough for
	// the cleaner's bursts of deletions to cover the rotations until its
	// next pass.
	spareSegments = 4
)

var crcTable = crc32.MakeTable(crc32.Castagnoli)

// segment is one log file. refs counts the log's own reference (while the
// segment is listed) plus one per open reader; the file closes at zero.
type segment struct {
	id   uint32
	f    vfs.File // for reading
	size int64    // bytes written (valid length once sealed)
	live int64    // bytes of bodies that blob records point at
	// blobs is the log index of a young segment: the blobs whose records
	// point into it. A frozen segment's is in Pebble, and blobs is nil.
	blobs  map[store.ID]struct{}
	frozen bool
	// freezing: a transaction in the group being committed writes the
	// segment's index into Pebble (Engine.freeze).
	freezing bool
	refs     int
	sealed   bool   // no more records will be written to it
	flushed  bool   // sealed, and Pebble's tables hold all its records
	seed     uint32 // checksum of the id that starts every checksum (0: "QLG1")
}

// bodyLog is the write-ahead log and body store. The writing half (cur, w,
// off, buf, failed) belongs to the committer; the segment table is shared
// with readers and the cleaner under mu.
type bodyLog struct {
	fs       vfs.FS
	dir      string
	segBytes int64

	mu   sync.Mutex
	segs map[uint32]*segment
	// spare holds deleted segments kept for reuse, renamed NNN.free; a
	// file is reused only once its last reader has released it.
	spare   []*segment
	written int64 // bytes appended since open
	removed int64 // segments deleted since open
	moved   int64 // body bytes copied forward since open

	cur *segment
	w   vfs.File
	off int64  // where the next record starts in cur
	buf []byte // the record being built
	// failed: a write or sync failed, so the log's tail is unknown and
	// no record may be written until recoverTail finds it again; only for
	// a lack of space (noSpace), which leaves the records before off as
	// durable as they were. Written by the committer under mu, so that
	// failure can read them from other goroutines.
	failed  error
	noSpace bool
	resumed int // times recoverTail resumed the log, for tests
	// wake tells the cleaner that a segment was sealed; cleaning
	// serializes its passes, and Check with them.
	wake     chan struct{}
	cleaning sync.Mutex
}

func segName(id uint32) string   { return fmt.Sprintf("%010d.log", id) }
func spareName(id uint32) string { return fmt.Sprintf("%010d.free", id) }

// logSeed is the checksum of a segment's id, from which the checksums of
// its header and records continue.
func logSeed(id uint32) uint32 {
	var b [4]byte
	binary.LittleEndian.PutUint32(b[:], id)
	return crc32.Checksum(b[:], crcTable)
}

// openLog lists the segments in dir without reading them.
func openLog(fs vfs.FS, dir string, segBytes int64) (*bodyLog, error) {
	if err := fs.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	names, err := fs.List(dir)
	if err != nil {
		return nil, err
	}
	l := &bodyLog{fs: fs, dir: dir, segBytes: segBytes, segs: map[uint32]*segment{}, wake: make(chan struct{}, 1)}
	for _, name := range names {
		num, ok := strings.CutSuffix(name, ".log")
		spare := false
		if !ok {
			if num, spare = strings.CutSuffix(name, ".free"); !spare {
				continue
			}
		}
		id, err := strconv.ParseUint(num, 10, 32)
		if err != nil || id == 0 {
			continue
		}
		if spare {
			if len(l.spare) < spareSegments {
				l.spare = append(l.spare, &segment{id: uint32(id)})
			} else if err := fs.Remove(fs.PathJoin(dir, name)); err != nil {
				l.close()
				return nil, err
			}
			continue
		}
		f, err := fs.Open(fs.PathJoin(dir, name))
		if err != nil {
			l.close()
			return nil, err
		}
		st, err := f.Stat()
		if err != nil {
			f.Close()
			l.close()
			return nil, err
		}
		l.segs[uint32(id)] = &segment{id: uint32(id), f: f, size: st.Size(), refs: 1, sealed: true}
	}
	return l, nil
}

// ids returns the listed segments' IDs in order.
func (l *bodyLog) ids() []uint32 {
	l.mu.Lock()
	defer l.mu.Unlock()
	ids := make([]uint32, 0, len(l.segs))
	for id := range l.segs {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	return ids
}

// replay applies to db, in order, every record after the position from
// (the persisted logPos; zero for none), then starts a new segment to
// write to. Segments before from's are marked flushed.
func (l *bodyLog) replay(db *pebble.DB, from logPos) error {
	ids := l.ids()
	end := int64(0) // valid length of the last segment
	for i, id := range ids {
		s := l.segs[id]
		last := i == len(ids)-1
		if id < from.seg {
			// Already applied. Its header says whether it may be reused;
			// a reused file may be longer than the segment, whose length
			// its successor's header gives.
			s.flushed = true
			_, s.seed, _ = readSegHeader(s)
			if !last && ids[i+1] == id+1 {
				if prev, ok := l.prevEnd(l.segs[id+1]); ok {
					s.size = prev
				}
			}
			continue
		}
		limit, lenient := s.size, last
		if !last {
			if ids[i+1] != id+1 {
				// The next segment was deleted, which the cleaner does only
				// once Pebble's tables hold all its records, and so all of
				// this one's: there is nothing here after from to apply.
				if id != from.seg {
					return fmt.Errorf("embedded: log segment %s is missing: %w", segName(id+1), errCorrupt)
				}
				continue
			}
			if prev, ok := l.prevEnd(l.segs[id+1]); ok {
				limit = prev
			} else {
				// The next segment's header is torn, so it never held a
				// record (its own replay refuses it if it did) and this
				// one was the last.
				lenient = true
			}
		}
		var err error
		end, err = l.replaySegment(db, s, limit, lenient, from)
		if err != nil {
			return err
		}
		s.size = end
	}
	next := uint32(1)
	if len(ids) > 0 {
		next = ids[len(ids)-1] + 1
	}
	return l.rotate(next, end)
}

// prevEnd reads the valid length of the segment before s from s's header;
// false if the header is torn.
func (l *bodyLog) prevEnd(s *segment) (int64, bool) {
	prev, _, ok := readSegHeader(s)
	return prev, ok
}

// readSegHeader reads and checks s's header, returning the previous
// segment's valid length and the seed of s's checksums; false if the header
// is torn or is what the file held before it was reused.
func readSegHeader(s *segment) (prevEnd int64, seed uint32, ok bool) {
	var h [segHeaderLen]byte
	if n, _ := s.f.ReadAt(h[:], 0); n < segHeaderLen {
		return 0, 0, false
	}
	switch string(h[:4]) {
	case segMagic:
		seed = logSeed(s.id)
	case segMagicV1:
	default:
		return 0, 0, false
	}
	if crc32.Update(seed, crcTable, h[:12]) != binary.LittleEndian.Uint32(h[12:16]) {
		return 0, 0, false
	}
	return int64(binary.LittleEndian.Uint64(h[4:12])), seed, true
}

// replaySegment applies the records of s up to limit that come after from,
// and returns the segment's valid length. In the last segment (lenient) a
// bad record is a torn tail and ends it; elsewhere records must fill limit
// exactly.
func (l *bodyLog) replaySegment(db *pebble.DB, s *segment, limit int64, lenient bool, from logPos) (int64, error) {
	corrupt := func(at int64, what string) (int64, error) {
		if lenient {
			return at, nil
		}
		return 0, fmt.Errorf("embedded: log segment %s at %d: %s: %w", segName(s.id), at, what, errCorrupt)
	}
	if limit <= segHeaderLen && !lenient {
		return limit, nil // its successor began before any record was written
	}
	_, seed, ok := readSegHeader(s)
	if !ok {
		// rotate syncs a header before the segment's first record is
		// written, so a crash can tear the header only of a segment that
		// never held a record. One whose first record checks out was
		// damaged since: corruption, even in the last segment.
		if firstRecordValid(s) {
			return 0, fmt.Errorf("embedded: log segment %s: bad header before valid records: %w", segName(s.id), errCorrupt)
		}
		return corrupt(0, "bad header")
	}
	s.seed = seed
	var payload []byte
	pos := int64(segHeaderLen)
	for pos < limit {
		n, sum, bad := readRecordHeader(s, pos, limit)
		if bad != "" {
			return corrupt(pos, bad)
		}
		applied := s.id == from.seg && pos <= from.off
		if !applied {
			if int64(cap(payload)) < n {
				payload = make([]byte, n)
			}
			payload = payload[:n]
			if got, _ := s.f.ReadAt(payload, pos+8); int64(got) < n {
				return corrupt(pos, "short record")
			}
			if crc32.Update(seed, crcTable, payload) != sum {
				return corrupt(pos, "checksum mismatch")
			}
			bodies := int64(binary.LittleEndian.Uint32(payload[:4]))
			if bodies > n-4 {
				return corrupt(pos, "bad bodies length")
			}
			b := db.NewBatch()
			if err := b.SetRepr(payload[4+bodies:]); err != nil {
				b.Close()
				return corrupt(pos, err.Error())
			}
			err := db.Apply(b, pebble.NoSync)
			b.Close()
			if err != nil {
				return 0, fmt.Errorf("embedded: replaying log segment %s at %d: %w", segName(s.id), pos, err)
			}
		}
		pos += 8 + n
	}
	return pos, nil
}

// readRecordHeader reads the header of the record at pos in s, which must
// end by limit, and returns its payload's length and checksum, or what is
// wrong with it.
func readRecordHeader(s *segment, pos, limit int64) (n int64, sum uint32, bad string) {
	var rh [8]byte
	if got, _ := s.f.ReadAt(rh[:], pos); got < len(rh) {
		return 0, 0, "short record header"
	}
	n = int64(binary.LittleEndian.Uint32(rh[:4]))
	if n < 4 || n > maxRecord || pos+8+n > limit {
		return 0, 0, "bad record length"
	}
	return n, binary.LittleEndian.Uint32(rh[4:]), ""
}

// firstRecordValid reports whether s holds a whole record with a valid
// checksum right after its header, under either format's seed. A reused
// file's old records fail both: their checksums cover another segment's id,
// and only segments of the current format are reused.
func firstRecordValid(s *segment) bool {
	n, sum, bad := readRecordHeader(s, segHeaderLen, s.size)
	if bad != "" {
		return false
	}
	payload := make([]byte, n)
	if got, _ := s.f.ReadAt(payload, segHeaderLen+8); int64(got) < n {
		return false
	}
	return crc32.Update(logSeed(s.id), crcTable, payload) == sum || crc32.Update(0, crcTable, payload) == sum
}

// rotate seals the current segment and starts segment id, whose header
// records prevEnd, in a spare file if one is free. The new file and its
// directory entry are synced before any record is written to it.
func (l *bodyLog) rotate(id uint32, prevEnd int64) error {
	name := l.fs.PathJoin(l.dir, segName(id))
	w, err := l.reuse(name)
	if w == nil && err == nil {
		w, err = l.fs.Create(name, vfs.WriteCategoryUnspecified)
	}
	if err != nil {
		return err
	}
	seed := logSeed(id)
	var h [segHeaderLen]byte
	copy(h[:4], segMagic)
	binary.LittleEndian.PutUint64(h[4:12], uint64(prevEnd))
	binary.LittleEndian.PutUint32(h[12:16], crc32.Update(seed, crcTable, h[:12]))
	err = errors.Join(write(w, h[:]), w.Sync())
	if err == nil {
		err = syncDir(l.fs, l.dir)
	}
	var r vfs.File
	if err == nil {
		r, err = l.fs.Open(name)
	}
	if err != nil {
		w.Close()
		return fmt.Errorf("embedded: starting log segment %s: %w", name, err)
	}
	if l.w != nil {
		l.w.Close()
	}
	s := &segment{id: id, f: r, size: segHeaderLen, refs: 1, seed: seed}
	l.mu.Lock()
	if l.cur != nil {
		l.cur.sealed = true
	}
	l.segs[id] = s
	l.written += segHeaderLen
	l.mu.Unlock()
	l.cur, l.w, l.off = s, w, segHeaderLen
	select {
	case l.wake <- struct{}{}:
	default:
	}
	return nil
}

// reuse renames a spare file that no reader holds any longer to name and
// opens it for writing from its start; nil if there is none.
func (l *bodyLog) reuse(name string) (vfs.File, error) {
	l.mu.Lock()
	i := slices.IndexFunc(l.spare, func(s *segment) bool { return s.refs == 0 })
	var s *segment
	if i >= 0 {
		s = l.spare[i]
		l.spare = slices.Delete(l.spare, i, i+1)
	}
	l.mu.Unlock()
	if s == nil {
		return nil, nil
	}
	if err := l.fs.Rename(l.fs.PathJoin(l.dir, spareName(s.id)), name); err != nil {
		return nil, err
	}
	return l.fs.OpenReadWrite(name, vfs.WriteCategoryUnspecified)
}

func write(w io.Writer, p []byte) error {
	_, err := w.Write(p)
	return err
}

// syncDir fsyncs a directory, making the entries in it durable.
func syncDir(fs vfs.FS, dir string) error {
	d, err := fs.OpenDir(dir)
	if err != nil {
		return err
	}
	err = d.Sync()
	return errors.Join(err, d.Close())
}

// begin starts the next record, moving to a new segment if the current one
// is full, and returns the record's position. Committer only.
func (l *bodyLog) begin() (logPos, error) {
	if l.failed != nil {
		return logPos{}, l.failed
	}
	if l.off >= l.segBytes {
		if err := l.rotate(l.cur.id+1, l.off); err != nil {
			return logPos{}, l.fail(err)
		}
	}
	if cap(l.buf) > 16<<20 {
		l.buf = nil // a large group's buffer is not kept
	}
	l.buf = append(l.buf[:0], make([]byte, recHeaderLen)...) // filled by commit
	return logPos{l.cur.id, l.off}, nil
}

// addBody appends a body to the record being built and returns where it
// will be in the log. Committer only, between begin and commit.
func (l *bodyLog) addBody(body []byte) (seg uint32, off int64) {
	off = l.off + int64(len(l.buf))
	l.buf = append(l.buf, body...)
	return l.cur.id, off
}

// mark and truncate let a failed transaction take back its bodies.
func (l *bodyLog) mark() int         { return len(l.buf) }
func (l *bodyLog) truncate(mark int) { l.buf = l.buf[:mark] }

// commit completes the record with the group's batch, writes it and syncs
// it. When it returns nil the record is durable. A failure leaves the
// log's tail unknown, so every later commit fails too until recoverTail
// (for a lack of space) or a reopen (for any other error) finds the tail.
// Committer only.
func (l *bodyLog) commit(repr []byte) error {
	bodies := len(l.buf) - recHeaderLen
	l.buf = append(l.buf, repr...)
	binary.LittleEndian.PutUint32(l.buf[0:4], uint32(len(l.buf)-8))
	binary.LittleEndian.PutUint32(l.buf[8:12], uint32(bodies))
	binary.LittleEndian.PutUint32(l.buf[4:8], crc32.Update(l.cur.seed, crcTable, l.buf[8:]))
	if err := write(l.w, l.buf); err != nil {
		return l.fail(fmt.Errorf("embedded: writing log segment %s: %w", segName(l.cur.id), err))
	}
	if err := l.w.SyncData(); err != nil {
		return l.fail(fmt.Errorf("embedded: syncing log segment %s: %w", segName(l.cur.id), err))
	}
	l.off += int64(len(l.buf))
	l.mu.Lock()
	l.cur.size = l.off
	l.written += int64(len(l.buf))
	l.mu.Unlock()
	return nil
}

// fail records that the log's tail is unknown after err, and returns err.
// Committer only.
func (l *bodyLog) fail(err error) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.failed == nil || l.noSpace {
		l.failed, l.noSpace = err, isNoSpace(err)
	}
	return err
}

// failure returns the error that stopped the log, if any, and whether
// recoverTail may resume it. Any goroutine.
func (l *bodyLog) failure() (err error, noSpace bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.failed, l.noSpace
}

// recoverTail resumes writing after a failure for lack of space, as Open's
// recovery would: the records before off are durable (each was synced
// before it was acknowledged), and what the failed write left after off,
// whole or torn, was never acknowledged. A new segment, whose synced header
// records off as the valid end of the one before, makes that end durable:
// replay stops the old segment there (records must fill it exactly) and
// never applies what lies after it. Until the header is synced nothing is
// written, so a crash in between recovers as one inside a rotation (the
// torn tail ends the segment). A write or sync that failed for lack of
// space (ENOSPC, EDQUOT; fdatasync reports them when delayed allocation
// fails) touched only bytes after off, which are abandoned, so their
// pages' fate does not matter. Any other failure, above all EIO (the
// device's state is unknown: after a failed fsync the kernel may have
// dropped the dirty pages), stays final until the store is reopened.
// Committer only.
func (l *bodyLog) recoverTail() error {
	err, noSpace := l.failure()
	if err == nil || !noSpace {
		return err
	}
	if err := l.rotate(l.cur.id+1, l.off); err != nil {
		return l.fail(err)
	}
	l.mu.Lock()
	l.failed, l.noSpace = nil, false
	l.resumed++
	l.mu.Unlock()
	return nil
}

// isNoSpace reports whether err is the file system's lack of space or quota.
func isNoSpace(err error) bool {
	return errors.Is(err, syscall.ENOSPC) || errors.Is(err, syscall.EDQUOT)
}

// segDelta is a blob's body of size bytes arriving in a segment (add) or
// leaving it, or the segment's index moving into Pebble (freeze).
type segDelta struct {
	seg    uint32
	bytes  int64
	blob   store.ID
	add    bool
	freeze bool
}

// addLive applies the deltas of a committed group, in order.
func (l *bodyLog) addLive(deltas []segDelta) {
	if len(deltas) == 0 {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, d := range deltas {
		s := l.segs[d.seg]
		if s == nil {
			continue
		}
		if d.freeze {
			s.frozen, s.freezing, s.blobs = true, false, nil
			continue
		}
		if !d.add {
			s.live -= d.bytes
			delete(s.blobs, d.blob) // a frozen segment's goes with its entry
			continue
		}
		s.live += d.bytes
		if s.frozen {
			// Only countLive adds to a frozen segment: bodies are
			// written into the current segment, which is young.
			continue
		}
		if s.blobs == nil {
			s.blobs = make(map[store.ID]struct{})
		}
		s.blobs[d.blob] = struct{}{}
	}
}

// youngBlobs returns the blobs in s's in-memory index, and whether s is
// frozen (its index in Pebble).
func (l *bodyLog) youngBlobs(s *segment) (ids []store.ID, frozen bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	ids = make([]store.ID, 0, len(s.blobs))
	for id := range s.blobs {
		ids = append(ids, id)
	}
	return ids, s.frozen
}

// isFrozen reports whether segment id keeps its index in Pebble, or a
// transaction of the group being committed moves it there: either way a
// transaction that drops or moves one of its blobs deletes the entry.
func (l *bodyLog) isFrozen(id uint32) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	s := l.segs[id]
	return s != nil && (s.frozen || s.freezing)
}

// acquire returns segment id with a reference the caller must release, or
// false if it is no longer listed.
func (l *bodyLog) acquire(id uint32) (*segment, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	s := l.segs[id]
	if s == nil {
		return nil, false
	}
	s.refs++
	return s, true
}

func (l *bodyLog) release(s *segment) {
	l.mu.Lock()
	s.refs--
	last := s.refs == 0
	l.mu.Unlock()
	if last {
		s.f.Close()
	}
}

// remove unlists a segment and deletes its file, or keeps the file as a
// spare for reuse; readers still holding it keep reading the open file,
// which is not reused before they release it.
func (l *bodyLog) remove(s *segment) error {
	l.mu.Lock()
	if l.segs[s.id] != s {
		l.mu.Unlock()
		return nil
	}
	delete(l.segs, s.id)
	l.removed++
	// A "QLG1" segment (seed 0) is never reused: what it held would pass
	// checksums that do not cover the id.
	keep := len(l.spare) < spareSegments && s.seed != 0
	l.mu.Unlock()
	name := l.fs.PathJoin(l.dir, segName(s.id))
	var err error
	if keep {
		if err = l.fs.Rename(name, l.fs.PathJoin(l.dir, spareName(s.id))); err == nil {
			l.mu.Lock()
			l.spare = append(l.spare, s)
			l.mu.Unlock()
		}
	} else {
		err = l.fs.Remove(name)
	}
	l.release(s)
	return err
}

// logStats describes the log for metrics and tests.
type logStats struct {
	size, live int64 // bytes on disk, bytes of referenced bodies
	segments   int
	// Since open: bytes appended, segments deleted, body bytes copied
	// forward.
	written, removed, moved int64
}

func (l *bodyLog) stats() logStats {
	l.mu.Lock()
	defer l.mu.Unlock()
	st := logStats{segments: len(l.segs), written: l.written, removed: l.removed, moved: l.moved}
	for _, s := range l.segs {
		st.size += s.size
		st.live += s.live
	}
	return st
}

// close closes every file; the engine calls it after the committer and
// cleaner have stopped.
func (l *bodyLog) close() {
	if l.w != nil {
		l.w.Close()
		l.w = nil
	}
	l.mu.Lock()
	segs := l.segs
	l.segs = map[uint32]*segment{}
	l.mu.Unlock()
	for _, s := range segs {
		l.release(s)
	}
}

// logPos is a record's position in the log.
type logPos struct {
	seg uint32
	off int64
}

func encodeLogPos(p logPos) []byte {
	b := binary.BigEndian.AppendUint32(nil, p.seg)
	return binary.BigEndian.AppendUint64(b, uint64(p.off))
}

func decodeLogPos(b []byte) (logPos, error) {
	if len(b) != 12 {
		return logPos{}, errCorrupt
	}
	return logPos{binary.BigEndian.Uint32(b), int64(binary.BigEndian.Uint64(b[4:]))}, nil
}
