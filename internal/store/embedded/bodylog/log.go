// Package bodylog is the embedded engine's body log: its write-ahead log
// and its store of message bodies, a directory of segment files.
//
// The log is the engine's write-ahead log: Pebble runs with its own WAL
// disabled, and every commit group is one record appended to the log and
// synced before the group's batch is applied to Pebble's memtable. A record
// carries the group's message bodies followed by the batch (Batch.Repr), so
// a body costs one sequential write and shares its group's one fdatasync,
// and it is never rewritten by Pebble's compactions: the LSM holds only a
// small record that locates it (the engine's blobRecord.Seg, Off).
//
// Layout. The log is a directory of segment files named by a decimal
// sequence number (SegName), each at most about segBytes. A segment starts
// with a header:
//
//	magic "QLG2" | prevEnd uint64 | crc32c(id, magic, prevEnd) uint32
//
// where id is the segment's number (uint32) and prevEnd is the valid length
// of the segment before it, and then holds records:
//
//	payloadLen uint32 | crc32c(id, payload) uint32 | payload:
//	    bodiesLen uint32 | bodies | batch repr
//
// All integers are little-endian. Each batch also sets the engine's log
// position key to the position (Pos, segment and offset) of its own record,
// so Pebble's persisted state names the last record it contains. Segments
// written before segments were reused have the magic "QLG1" and checksums
// without the id.
//
// Recovery. At open (Replay) every record after the persisted position is
// applied again, in order. A record that is short or fails its CRC ends the
// last segment (a torn write that was never acknowledged: records are
// acknowledged only after their sync); writing resumes in a new segment
// whose header records where the old one ended, so that a later recovery
// can tell that end from corruption, which anywhere else is an error
// (ErrCorrupt).
//
// Reuse. A deleted segment's file is kept (renamed NNN.free, at most
// SpareSegments of them) and becomes a later segment, overwritten in place:
// an fdatasync of a write within the file's allocated, written length
// flushes only data, where an append must also commit the file system's
// journal (the new length and blocks), which doubled the sync's time here
// (docs/adr/0009). Because the checksums cover the segment's id, what the
// file held before, header or records, fails them and ends the segment as a
// torn tail would.
//
// Space. A segment can be deleted once Pebble holds all of its records in
// tables (a flush finished after the segment was sealed) and no blob
// record points into it. The log counts each segment's live bytes in
// memory (AddLive), and the engine keeps its log index, the blobs whose
// records point into it:
//   - in memory (the young index, YoungBlobs) while the segment is young:
//     the committer keeps it with every group it commits, and opening the
//     store rebuilds it from the blob records (the engine's countLive).
//     Most bodies die young under mail's retrieve-and-delete pattern, and
//     so never touch Pebble.
//   - in Pebble ('g' segment, blob -> size) once it is frozen: while the
//     young segments list more than LogIndexBlobs blobs, the oldest is
//     frozen, one transaction writing the entries of the blobs still in
//     it (StartFreeze, then a Freeze delta); later transactions delete an
//     entry with its blob or its move (IsFrozen). Memory thus holds a
//     bounded index, however much mail the store keeps, and a store whose
//     live mail fits the bound (most, at 2 Mi bodies) writes no index
//     entry at all.
//
// Every body is written into the current segment in the log record that
// also writes its blob record, so a sealed segment never gains a blob. The
// engine's cleaner copies the live bodies of sealed segments forward into
// the current segment, through the committer (its cleanPlan says which and
// when), and deletes a segment (Remove) once its index is empty. Readers
// hold a reference on the segment they read (Acquire, Release), so a
// deleted segment's file is closed only after its last reader.
//
// The log's errors read "embedded: ...", as the engine's do: it is a part
// of the engine, and its errors reach the engine's callers unchanged.
package bodylog

import (
	"cmp"
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

	"github.com/cockroachdb/pebble/v2/vfs"

	"quill/internal/store"
)

const (
	segMagic   = "QLG2"
	segMagicV1 = "QLG1" // no id in the checksums
	// HeaderLen is the length of a segment's header: its first record
	// starts there.
	HeaderLen    = 16
	recHeaderLen = 12
	// maxRecord bounds a record's length at recovery: a larger length can
	// only be garbage (a group is at most MaxGroup inline bodies).
	maxRecord = 1 << 30
	// SpareSegments bounds the deleted segments kept for reuse: enough for
	// the cleaner's bursts of deletions to cover the rotations until its
	// next pass.
	SpareSegments = 4
)

// ErrCorrupt marks a log that fails its checks where a crash cannot have
// left it so; the engine's decoders report corrupt records with it too.
var ErrCorrupt = errors.New("embedded: corrupt record")

var crcTable = crc32.MakeTable(crc32.Castagnoli)

// Segment is one log file. refs counts the log's own reference (while the
// segment is listed) plus one per open reader; the file closes at zero. Its
// fields are the log's, under the log's mu (Log.Info reads them).
type Segment struct {
	id   uint32
	f    vfs.File // for reading
	size int64    // bytes written (valid length once sealed)
	live int64    // bytes of bodies that blob records point at
	// blobs is the log index of a young segment: the blobs whose records
	// point into it. A frozen segment's is in Pebble, and blobs is nil.
	blobs  map[store.ID]struct{}
	frozen bool
	// freezing: a transaction in the group being committed writes the
	// segment's index into Pebble (StartFreeze).
	freezing bool
	refs     int
	sealed   bool   // no more records will be written to it
	flushed  bool   // sealed, and Pebble's tables hold all its records
	seed     uint32 // checksum of the id that starts every checksum (0: "QLG1")
}

// ID returns the segment's number.
func (s *Segment) ID() uint32 { return s.id }

// ReadAt reads the segment's file: a body at the offset its blob record
// gives. The caller holds a reference (Acquire) or is the cleaner, which
// alone removes segments.
func (s *Segment) ReadAt(p []byte, off int64) (int, error) { return s.f.ReadAt(p, off) }

// Log is the write-ahead log and body store. The writing half (cur, w,
// off, buf, failed) belongs to the committer; the segment table is shared
// with readers and the cleaner under mu.
type Log struct {
	fs       vfs.FS
	dir      string
	segBytes int64

	mu   sync.Mutex
	segs map[uint32]*Segment
	// spare holds deleted segments kept for reuse, renamed NNN.free; a
	// file is reused only once its last reader has released it.
	spare   []*Segment
	written int64 // bytes appended since open
	removed int64 // segments deleted since open
	moved   int64 // body bytes copied forward since open

	cur *Segment
	w   vfs.File
	off int64  // where the next record starts in cur
	buf []byte // the record being built
	// failed: a write or sync failed, so the log's tail is unknown and
	// no record may be written until RecoverTail finds it again; only for
	// a lack of space (noSpace), which leaves the records before off as
	// durable as they were. Written by the committer under mu, so that
	// Failure can read them from other goroutines.
	failed  error
	noSpace bool
	resumed int // times RecoverTail resumed the log, for tests
	// wake tells the cleaner that a segment was sealed.
	wake chan struct{}
}

// SegName is the file name of segment id.
func SegName(id uint32) string   { return fmt.Sprintf("%010d.log", id) }
func spareName(id uint32) string { return fmt.Sprintf("%010d.free", id) }

// logSeed is the checksum of a segment's id, from which the checksums of
// its header and records continue.
func logSeed(id uint32) uint32 {
	var b [4]byte
	binary.LittleEndian.PutUint32(b[:], id)
	return crc32.Checksum(b[:], crcTable)
}

// Open lists the segments in dir without reading them; Replay reads them
// and readies the log for writing. Segments roll over once they hold
// segBytes.
func Open(fs vfs.FS, dir string, segBytes int64) (*Log, error) {
	if err := fs.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	names, err := fs.List(dir)
	if err != nil {
		return nil, err
	}
	l := &Log{fs: fs, dir: dir, segBytes: segBytes, segs: map[uint32]*Segment{}, wake: make(chan struct{}, 1)}
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
			if len(l.spare) < SpareSegments {
				l.spare = append(l.spare, &Segment{id: uint32(id)})
			} else if err := fs.Remove(fs.PathJoin(dir, name)); err != nil {
				l.Close()
				return nil, err
			}
			continue
		}
		f, err := fs.Open(fs.PathJoin(dir, name))
		if err != nil {
			l.Close()
			return nil, err
		}
		st, err := f.Stat()
		if err != nil {
			f.Close()
			l.Close()
			return nil, err
		}
		l.segs[uint32(id)] = &Segment{id: uint32(id), f: f, size: st.Size(), refs: 1, sealed: true}
	}
	return l, nil
}

// ids returns the listed segments' IDs in order.
func (l *Log) ids() []uint32 {
	l.mu.Lock()
	defer l.mu.Unlock()
	ids := make([]uint32, 0, len(l.segs))
	for id := range l.segs {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	return ids
}

// Wake receives a value (never more than one waiting) whenever a segment
// is sealed: the cleaner's cue.
func (l *Log) Wake() <-chan struct{} { return l.wake }

// rotate seals the current segment and starts segment id, whose header
// records prevEnd, in a spare file if one is free. The new file and its
// directory entry are synced before any record is written to it.
func (l *Log) rotate(id uint32, prevEnd int64) error {
	name := l.fs.PathJoin(l.dir, SegName(id))
	w, err := l.reuse(name)
	if w == nil && err == nil {
		w, err = l.fs.Create(name, vfs.WriteCategoryUnspecified)
	}
	if err != nil {
		return err
	}
	seed := logSeed(id)
	var h [HeaderLen]byte
	copy(h[:4], segMagic)
	binary.LittleEndian.PutUint64(h[4:12], uint64(prevEnd))
	binary.LittleEndian.PutUint32(h[12:16], crc32.Update(seed, crcTable, h[:12]))
	err = errors.Join(write(w, h[:]), w.Sync())
	if err == nil {
		err = SyncDir(l.fs, l.dir)
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
	s := &Segment{id: id, f: r, size: HeaderLen, refs: 1, seed: seed}
	l.mu.Lock()
	if l.cur != nil {
		l.cur.sealed = true
	}
	l.segs[id] = s
	l.written += HeaderLen
	l.mu.Unlock()
	l.cur, l.w, l.off = s, w, HeaderLen
	select {
	case l.wake <- struct{}{}:
	default:
	}
	return nil
}

// reuse renames a spare file that no reader holds any longer to name and
// opens it for writing from its start; nil if there is none.
func (l *Log) reuse(name string) (vfs.File, error) {
	l.mu.Lock()
	i := slices.IndexFunc(l.spare, func(s *Segment) bool { return s.refs == 0 })
	var s *Segment
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

// SyncDir fsyncs a directory, making the entries in it durable.
func SyncDir(fs vfs.FS, dir string) error {
	d, err := fs.OpenDir(dir)
	if err != nil {
		return err
	}
	err = d.Sync()
	return errors.Join(err, d.Close())
}

// Begin starts the next record, moving to a new segment if the current one
// is full, and returns the record's position. Committer only.
func (l *Log) Begin() (Pos, error) {
	if l.failed != nil {
		return Pos{}, l.failed
	}
	if l.off >= l.segBytes {
		if err := l.rotate(l.cur.id+1, l.off); err != nil {
			return Pos{}, l.Fail(err)
		}
	}
	if cap(l.buf) > 16<<20 {
		l.buf = nil // a large group's buffer is not kept
	}
	l.buf = append(l.buf[:0], make([]byte, recHeaderLen)...) // filled by Commit
	return Pos{l.cur.id, l.off}, nil
}

// AddBody appends a body to the record being built and returns where it
// will be in the log. Committer only, between Begin and Commit.
func (l *Log) AddBody(body []byte) (seg uint32, off int64) {
	off = l.off + int64(len(l.buf))
	l.buf = append(l.buf, body...)
	return l.cur.id, off
}

// Mark and Truncate let a failed transaction take back its bodies.
func (l *Log) Mark() int         { return len(l.buf) }
func (l *Log) Truncate(mark int) { l.buf = l.buf[:mark] }

// Commit completes the record with the group's batch, writes it and syncs
// it. When it returns nil the record is durable. A failure leaves the
// log's tail unknown, so every later commit fails too until RecoverTail
// (for a lack of space) or a reopen (for any other error) finds the tail.
// Committer only.
func (l *Log) Commit(repr []byte) error {
	bodies := len(l.buf) - recHeaderLen
	l.buf = append(l.buf, repr...)
	binary.LittleEndian.PutUint32(l.buf[0:4], uint32(len(l.buf)-8))
	binary.LittleEndian.PutUint32(l.buf[8:12], uint32(bodies))
	binary.LittleEndian.PutUint32(l.buf[4:8], crc32.Update(l.cur.seed, crcTable, l.buf[8:]))
	if err := write(l.w, l.buf); err != nil {
		return l.Fail(fmt.Errorf("embedded: writing log segment %s: %w", SegName(l.cur.id), err))
	}
	if err := l.w.SyncData(); err != nil {
		return l.Fail(fmt.Errorf("embedded: syncing log segment %s: %w", SegName(l.cur.id), err))
	}
	l.off += int64(len(l.buf))
	l.mu.Lock()
	l.cur.size = l.off
	l.written += int64(len(l.buf))
	l.mu.Unlock()
	return nil
}

// Fail records that the log's tail is unknown after err, and returns err.
// Committer only.
func (l *Log) Fail(err error) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.failed == nil || l.noSpace {
		l.failed, l.noSpace = err, IsNoSpace(err)
	}
	return err
}

// Failure returns the error that stopped the log, if any, and whether
// RecoverTail may resume it. Any goroutine.
func (l *Log) Failure() (err error, noSpace bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.failed, l.noSpace
}

// RecoverTail resumes writing after a failure for lack of space, as
// Replay's recovery would: the records before off are durable (each was
// synced before it was acknowledged), and what the failed write left after
// off, whole or torn, was never acknowledged. A new segment, whose synced
// header records off as the valid end of the one before, makes that end
// durable: replay stops the old segment there (records must fill it
// exactly) and never applies what lies after it. Until the header is
// synced nothing is written, so a crash in between recovers as one inside
// a rotation (the torn tail ends the segment). A write or sync that failed
// for lack of space (ENOSPC, EDQUOT; fdatasync reports them when delayed
// allocation fails) touched only bytes after off, which are abandoned, so
// their pages' fate does not matter. Any other failure, above all EIO (the
// device's state is unknown: after a failed fsync the kernel may have
// dropped the dirty pages), stays final until the store is reopened.
// Committer only.
func (l *Log) RecoverTail() error {
	err, noSpace := l.Failure()
	if err == nil || !noSpace {
		return err
	}
	if err := l.rotate(l.cur.id+1, l.off); err != nil {
		return l.Fail(err)
	}
	l.mu.Lock()
	l.failed, l.noSpace = nil, false
	l.resumed++
	l.mu.Unlock()
	return nil
}

// IsNoSpace reports whether err is the file system's lack of space or
// quota: a failure RecoverTail resumes from.
func IsNoSpace(err error) bool {
	return errors.Is(err, syscall.ENOSPC) || errors.Is(err, syscall.EDQUOT)
}

// Delta is a blob's body of Bytes bytes arriving in segment Seg (Add) or
// leaving it, or the segment's index moving into Pebble (Freeze).
type Delta struct {
	Seg    uint32
	Bytes  int64
	Blob   store.ID
	Add    bool
	Freeze bool
}

// AddLive applies the deltas of a committed group, in order.
func (l *Log) AddLive(deltas []Delta) {
	if len(deltas) == 0 {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, d := range deltas {
		s := l.segs[d.Seg]
		if s == nil {
			continue
		}
		if d.Freeze {
			s.frozen, s.freezing, s.blobs = true, false, nil
			continue
		}
		if !d.Add {
			s.live -= d.Bytes
			delete(s.blobs, d.Blob) // a frozen segment's goes with its entry
			continue
		}
		s.live += d.Bytes
		if s.frozen {
			// Only the engine's countLive adds to a frozen segment:
			// bodies are written into the current segment, which is
			// young.
			continue
		}
		if s.blobs == nil {
			s.blobs = make(map[store.ID]struct{})
		}
		s.blobs[d.Blob] = struct{}{}
	}
}

// YoungBlobs returns the blobs in s's in-memory index, and whether s is
// frozen (its index in Pebble).
func (l *Log) YoungBlobs(s *Segment) (ids []store.ID, frozen bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	ids = make([]store.ID, 0, len(s.blobs))
	for id := range s.blobs {
		ids = append(ids, id)
	}
	return ids, s.frozen
}

// StartFreeze records that a transaction of the group being committed
// writes s's index into Pebble: IsFrozen reports s frozen from now on, so
// that the group's later transactions delete the entries they drop; the
// in-memory index goes with the group's Freeze delta (AddLive).
func (l *Log) StartFreeze(s *Segment) {
	l.mu.Lock()
	s.freezing = true
	l.mu.Unlock()
}

// IsFrozen reports whether segment id keeps its index in Pebble, or a
// transaction of the group being committed moves it there: either way a
// transaction that drops or moves one of its blobs deletes the entry.
func (l *Log) IsFrozen(id uint32) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	s := l.segs[id]
	return s != nil && (s.frozen || s.freezing)
}

// SegmentInfo is what the log knows of one segment, as of the call that
// returned it.
type SegmentInfo struct {
	Seg   *Segment
	ID    uint32
	Size  int64 // bytes written (valid length once sealed)
	Live  int64 // bytes of bodies that blob records point at
	Blobs int   // blobs in the young index
	// Sealed: no more records will be written to it. Flushed: sealed,
	// and Pebble's tables hold all its records (SetFlushed).
	Sealed, Flushed bool
	Frozen          bool // its index is in Pebble
}

func (s *Segment) info() SegmentInfo {
	return SegmentInfo{Seg: s, ID: s.id, Size: s.size, Live: s.live, Blobs: len(s.blobs),
		Sealed: s.sealed, Flushed: s.flushed, Frozen: s.frozen}
}

// Segments returns the listed segments, in order, as of one moment.
func (l *Log) Segments() []SegmentInfo {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := make([]SegmentInfo, 0, len(l.segs))
	for _, s := range l.segs {
		out = append(out, s.info())
	}
	slices.SortFunc(out, func(a, b SegmentInfo) int { return cmp.Compare(a.ID, b.ID) })
	return out
}

// Info returns what the log knows of s now.
func (l *Log) Info(s *Segment) SegmentInfo {
	l.mu.Lock()
	defer l.mu.Unlock()
	return s.info()
}

// SetFlushed records that Pebble's tables hold every record of segs, which
// are sealed: a flush that began after they were sealed has finished.
func (l *Log) SetFlushed(segs []*Segment) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, s := range segs {
		s.flushed = true
	}
}

// AddMoved counts body bytes the cleaner copied forward (Stats.Moved).
func (l *Log) AddMoved(n int64) {
	l.mu.Lock()
	l.moved += n
	l.mu.Unlock()
}

// Acquire returns segment id with a reference the caller must release, or
// false if it is no longer listed.
func (l *Log) Acquire(id uint32) (*Segment, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	s := l.segs[id]
	if s == nil {
		return nil, false
	}
	s.refs++
	return s, true
}

// Release drops a reference Acquire took.
func (l *Log) Release(s *Segment) {
	l.mu.Lock()
	s.refs--
	last := s.refs == 0
	l.mu.Unlock()
	if last {
		s.f.Close()
	}
}

// Remove unlists a segment and deletes its file, or keeps the file as a
// spare for reuse; readers still holding it keep reading the open file,
// which is not reused before they release it.
func (l *Log) Remove(s *Segment) error {
	l.mu.Lock()
	if l.segs[s.id] != s {
		l.mu.Unlock()
		return nil
	}
	delete(l.segs, s.id)
	l.removed++
	// A "QLG1" segment (seed 0) is never reused: what it held would pass
	// checksums that do not cover the id.
	keep := len(l.spare) < SpareSegments && s.seed != 0
	l.mu.Unlock()
	name := l.fs.PathJoin(l.dir, SegName(s.id))
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
	l.Release(s)
	return err
}

// Stats describes the log for metrics and tests.
type Stats struct {
	Size, Live int64 // bytes on disk, bytes of referenced bodies
	Segments   int
	// Since open: bytes appended, segments deleted, body bytes copied
	// forward.
	Written, Removed, Moved int64
	Spares                  int // deleted segments' files kept for reuse
	Resumed                 int // times RecoverTail resumed the log
}

// Stats returns the log's counts now.
func (l *Log) Stats() Stats {
	l.mu.Lock()
	defer l.mu.Unlock()
	st := Stats{Segments: len(l.segs), Written: l.written, Removed: l.removed, Moved: l.moved,
		Spares: len(l.spare), Resumed: l.resumed}
	for _, s := range l.segs {
		st.Size += s.size
		st.Live += s.live
	}
	return st
}

// Close closes every file; the engine calls it after the committer and
// cleaner have stopped.
func (l *Log) Close() {
	if l.w != nil {
		l.w.Close()
		l.w = nil
	}
	l.mu.Lock()
	segs := l.segs
	l.segs = map[uint32]*Segment{}
	l.mu.Unlock()
	for _, s := range segs {
		l.Release(s)
	}
}

// Pos is a record's position in the log.
type Pos struct {
	Seg uint32
	Off int64
}

// Encode returns p as the engine stores it in Pebble (DecodePos).
func (p Pos) Encode() []byte {
	b := binary.BigEndian.AppendUint32(nil, p.Seg)
	return binary.BigEndian.AppendUint64(b, uint64(p.Off))
}

// DecodePos reads a position Encode wrote.
func DecodePos(b []byte) (Pos, error) {
	if len(b) != 12 {
		return Pos{}, ErrCorrupt
	}
	return Pos{binary.BigEndian.Uint32(b), int64(binary.BigEndian.Uint64(b[4:]))}, nil
}
