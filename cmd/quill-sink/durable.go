package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"log/slog"
	"math"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"syscall"
)

// The durable log is one append-only file of records, each
//
//	length  uint32, little endian: octets of payload
//	crc     uint32, little endian: CRC-32C (Castagnoli) of payload
//	payload one of the kinds below, told apart by its first octet
//
// written with one write call. The payload kinds:
//
//	'M' a message: uvarint count of recipients, each recipient's user as
//	    uvarint length + octets, then the message as Deliver received it,
//	    trace fields included, to the end of the payload
//	'X' an expunge: uvarint length + octets of a user, uvarint count, then
//	    that many uvarint offsets of 'M' records: messages removed from
//	    the user's maildrop
//
// A message's offset in the file (where its record starts) names it: it is
// its POP3 unique-id. The log is the whole store: replaying it gives every
// user's maildrop (the messages delivered to the user minus those an
// expunge removed), which is how the mail floor (maildrops.go) rebuilds
// its index on open.
//
// Invariants:
//
//   - Records are written one at a time under durableLog.mu, so the file is
//     the records in write order and mu.appended is its length.
//   - mu.synced <= mu.appended, and every octet below mu.synced is covered
//     by a completed fdatasync (with noSync: written). A write returns nil
//     only once mu.synced has reached the end of its record.
//   - After a failed write or fdatasync, mu.err is set and never cleared:
//     a partial write leaves a torn record that later records would follow,
//     and after a failed fdatasync Linux may have dropped the dirty pages
//     (a retried fdatasync can succeed without writing them). Records
//     already covered by a sync stay acknowledged; nothing later is.
//
// Group commit, leader and followers:
//
//	lock; write record; target := appended
//	while synced < target:
//	    if err: unlock; fail
//	    if nobody is syncing: become leader, upto := appended, unlock,
//	        fdatasync, lock, synced = upto (or err), wake everyone
//	    else: wait for a wake-up
//	unlock; acknowledge
//
// The leader syncs without the lock, so writers keep appending meanwhile
// and the next leader covers all of them with one fdatasync. The rejected
// alternative, a timer that batches syncs, adds latency at low load and
// needs tuning; this adapts to the disk on its own.
//
// On open, a tail that is not a whole record with a valid checksum is cut
// off: it can only be a write that a crash interrupted before its sync,
// which was therefore never acknowledged. (Corruption in the middle of the
// log would be cut off the same way; the sink does not tell media faults
// apart from torn writes.)

// logName is the log's file name inside the --durable directory.
const logName = "sink.log"

// recordHeaderLen is the octets of length and checksum before each payload.
const recordHeaderLen = 8

// Payload kinds, the first octet of a payload.
const (
	kindMessage = 'M'
	kindExpunge = 'X'
)

// maxPooledBuffer bounds the capacity of a buffer kept for reuse, so that
// one large message does not pin its buffer for the process's life.
const maxPooledBuffer = 4 << 20

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

var zeroHeader [recordHeaderLen]byte

// errLogClosed fails an Append after Close.
var errLogClosed = errors.New("sink: durable log closed")

// durableLog appends records to one file and makes each durable (unless
// noSync) before Append or Expunge returns. It is safe for concurrent use.
type durableLog struct {
	f *os.File // opened for reading and appending
	// noSync makes a write return once its record is written, in the page
	// cache, never syncing: the records then survive a crash of the
	// process but not of the host. Set before the first write.
	noSync bool
	bufs   sync.Pool // *bytes.Buffer
	cond   sync.Cond // on &mu: signalled when a sync completes or the log closes
	mu     struct {
		sync.Mutex
		appended int64 // file length: end of the last record written
		synced   int64 // end of what the last completed fdatasync covers
		syncing  bool  // a leader is in fdatasync
		err      error // sticky; errLogClosed after Close
	}
}

// msgLoc is where a message record's message lies in the log.
type msgLoc struct {
	rec  int64 // offset of the record: the message's name
	body int64 // offset of the message's first octet
	size int64 // octets of message
}

// replayFunc receives each whole record of the log on open, in order:
// its offset and its payload (valid only during the call).
type replayFunc func(off int64, payload []byte) error

// openDurableLog opens (creating it and dir if needed) the log in dir,
// cuts a torn tail off, and syncs the directories that name it. replay,
// if not nil, is called for every record that stays.
func openDurableLog(dir string, log *slog.Logger, replay replayFunc) (*durableLog, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	path := filepath.Join(dir, logName)
	end, size, err := validPrefix(path, replay)
	if err != nil {
		return nil, fmt.Errorf("sink: reading %s: %w", path, err)
	}
	if end < size {
		log.Warn("cutting off a torn tail of the durable log", "path", path, "valid", end, "size", size)
		if err := os.Truncate(path, end); err != nil {
			return nil, err
		}
	}
	f, err := os.OpenFile(path, os.O_APPEND|os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, err
	}
	// fsync, not fdatasync: the file may be new, or just truncated.
	if err := f.Sync(); err != nil {
		f.Close()
		return nil, fmt.Errorf("sink: syncing %s: %w", path, err)
	}
	if err := syncDirChain(path); err != nil {
		f.Close()
		return nil, fmt.Errorf("sink: syncing the directories of %s: %w", path, err)
	}
	return newDurableLog(f, end), nil
}

// newDurableLog wraps f, opened for appending, whose length is size and
// all of it durable.
func newDurableLog(f *os.File, size int64) *durableLog {
	l := &durableLog{f: f}
	l.cond.L = &l.mu
	l.mu.appended, l.mu.synced = size, size
	l.bufs.New = func() any { return new(bytes.Buffer) }
	return l
}

// validPrefix returns the length of the longest prefix of the file at path
// made of whole records with valid checksums, and the file's size; both 0
// when there is no file. It calls visit, if not nil, for each of those
// records; an error from visit is returned.
func validPrefix(path string, visit replayFunc) (end, size int64, err error) {
	f, err := os.Open(path)
	if errors.Is(err, os.ErrNotExist) {
		return 0, 0, nil
	}
	if err != nil {
		return 0, 0, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return 0, 0, err
	}
	size = fi.Size()
	br := bufio.NewReaderSize(f, 1<<20)
	var hdr [recordHeaderLen]byte
	var payload []byte
	for {
		if _, err := io.ReadFull(br, hdr[:]); err != nil {
			return end, size, eofIsTorn(err)
		}
		n := int64(binary.LittleEndian.Uint32(hdr[0:4]))
		if n > size-end-recordHeaderLen {
			return end, size, nil // cut short: torn
		}
		payload = slices.Grow(payload[:0], int(n))[:n]
		if _, err := io.ReadFull(br, payload); err != nil {
			return end, size, eofIsTorn(err)
		}
		if crc32.Checksum(payload, castagnoli) != binary.LittleEndian.Uint32(hdr[4:8]) {
			return end, size, nil
		}
		if visit != nil {
			if err := visit(end, payload); err != nil {
				return end, size, fmt.Errorf("record at %d: %w", end, err)
			}
		}
		end += recordHeaderLen + n
	}
}

// eofIsTorn maps the end of the file inside or before a record to nil.
func eofIsTorn(err error) error {
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
		return nil
	}
	return err
}

// syncDirChain fsyncs every directory from path's parent up to the root, so
// that the entries naming path and the directories MkdirAll created are
// durable.
func syncDirChain(path string) error {
	for dir := filepath.Dir(path); ; dir = filepath.Dir(dir) {
		d, err := os.Open(dir)
		if err != nil {
			return err
		}
		err = d.Sync()
		d.Close()
		if err != nil {
			return err
		}
		if parent := filepath.Dir(dir); parent == dir {
			return nil
		}
	}
}

// Append reads body to its end and returns nil only once it is on disk as
// one message record for users, covered by an fdatasync. Any error means
// the record may or may not be in the log and must not be acknowledged.
// The body is read whole into memory; its size is bounded by the SMTP
// front end's message size limit. ctx is checked before the record is
// written; once written, Append waits for its sync, which only the disk
// bounds.
func (l *durableLog) Append(ctx context.Context, users []string, body io.Reader) (msgLoc, error) {
	buf := l.getBuffer()
	defer l.putBuffer(buf)
	buf.WriteByte(kindMessage)
	writeUvarint(buf, uint64(len(users)))
	for _, u := range users {
		appendString(buf, u)
	}
	head := int64(buf.Len() - recordHeaderLen) // payload octets before the message
	if _, err := buf.ReadFrom(body); err != nil {
		return msgLoc{}, fmt.Errorf("sink: reading body: %w", err)
	}
	off, err := l.write(ctx, buf)
	if err != nil {
		return msgLoc{}, err
	}
	return msgLoc{rec: off, body: off + recordHeaderLen + head, size: int64(buf.Len()) - head}, nil
}

// Expunge returns nil only once an expunge record removing the messages
// recs from user's maildrop is on disk, covered by an fdatasync.
func (l *durableLog) Expunge(ctx context.Context, user string, recs []int64) error {
	buf := l.getBuffer()
	defer l.putBuffer(buf)
	buf.WriteByte(kindExpunge)
	appendString(buf, user)
	writeUvarint(buf, uint64(len(recs)))
	for _, r := range recs {
		writeUvarint(buf, uint64(r))
	}
	_, err := l.write(ctx, buf)
	return err
}

// writeUvarint writes x as a uvarint, without allocating.
func writeUvarint(buf *bytes.Buffer, x uint64) {
	var v [binary.MaxVarintLen64]byte
	buf.Write(binary.AppendUvarint(v[:0], x))
}

// appendString writes s as uvarint length + octets.
func appendString(buf *bytes.Buffer, s string) {
	writeUvarint(buf, uint64(len(s)))
	buf.WriteString(s)
}

// getBuffer returns an empty buffer holding room for a record header.
func (l *durableLog) getBuffer() *bytes.Buffer {
	buf := l.bufs.Get().(*bytes.Buffer)
	buf.Reset()
	buf.Write(zeroHeader[:]) // filled in by write
	return buf
}

func (l *durableLog) putBuffer(buf *bytes.Buffer) {
	if buf.Cap() <= maxPooledBuffer {
		l.bufs.Put(buf)
	}
}

// write completes the record in buf (a header's room, then the payload),
// appends it and returns its offset once an fdatasync covers it. On
// return, buf holds the payload alone, for the caller's length arithmetic.
func (l *durableLog) write(ctx context.Context, buf *bytes.Buffer) (int64, error) {
	rec := buf.Bytes()
	n := len(rec) - recordHeaderLen
	if n > math.MaxUint32 {
		return 0, fmt.Errorf("sink: payload of %d octets does not fit a record", n)
	}
	binary.LittleEndian.PutUint32(rec[0:4], uint32(n))
	binary.LittleEndian.PutUint32(rec[4:8], crc32.Checksum(rec[recordHeaderLen:], castagnoli))
	buf.Next(recordHeaderLen)
	if err := ctx.Err(); err != nil {
		return 0, err
	}

	l.mu.Lock()
	defer l.mu.Unlock()
	if l.mu.err != nil {
		return 0, l.mu.err
	}
	off := l.mu.appended
	if _, err := l.f.Write(rec); err != nil {
		l.failLocked(fmt.Errorf("sink: appending to the durable log: %w", err))
		return 0, l.mu.err
	}
	l.mu.appended += int64(len(rec))
	if l.noSync {
		l.mu.synced = l.mu.appended
		return off, nil
	}
	target := l.mu.appended
	for l.mu.synced < target {
		if l.mu.err != nil {
			return 0, l.mu.err
		}
		if l.mu.syncing {
			l.cond.Wait()
			continue
		}
		l.mu.syncing = true
		upto := l.mu.appended
		l.mu.Unlock()
		err := fdatasync(l.f)
		l.mu.Lock()
		l.mu.syncing = false
		if err != nil {
			l.failLocked(fmt.Errorf("sink: fdatasync of the durable log: %w", err))
		} else {
			l.mu.synced = upto
		}
		l.cond.Broadcast()
	}
	return off, nil
}

// failLocked makes err the log's sticky error and wakes the waiters to
// see it.
func (l *durableLog) failLocked(err error) {
	if l.mu.err == nil {
		l.mu.err = err
	}
	l.cond.Broadcast()
}

// Close waits for a sync in progress and closes the file; later Appends
// fail. Everything acknowledged is already durable, so Close does not
// sync.
func (l *durableLog) Close() error {
	l.mu.Lock()
	for l.mu.syncing {
		l.cond.Wait()
	}
	if errors.Is(l.mu.err, errLogClosed) {
		l.mu.Unlock()
		return nil
	}
	l.mu.err = errLogClosed
	l.cond.Broadcast()
	l.mu.Unlock()
	return l.f.Close()
}

// fdatasync flushes f's data and the metadata needed to read it back (its
// length), not its timestamps.
func fdatasync(f *os.File) error {
	rc, err := f.SyscallConn()
	if err != nil {
		return err
	}
	var serr error
	if err := rc.Control(func(fd uintptr) {
		for {
			serr = syscall.Fdatasync(int(fd))
			if serr != syscall.EINTR {
				return
			}
		}
	}); err != nil {
		return err
	}
	return serr
}
