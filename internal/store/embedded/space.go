package embedded

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/prometheus/client_golang/prometheus"

	"quill/internal/store"
	"quill/internal/store/embedded/bodylog"
)

// A full disk (docs/adr/0013-full-disk.md). The engine's file system is
// wrapped by vfs.OnDiskFull, so the first write of the log or of Pebble
// (a flush, a compaction, the MANIFEST, whose failure Pebble treats as
// fatal) that meets ENOSPC or EDQUOT runs onDiskFull, with every other
// write held, and is then retried once. onDiskFull deletes the reserve, a
// file of Options.ReserveBytes allocated at open, so that the retry and
// what follows find room, and puts the engine in the full state:
//
//   - transactions that store a body (deliveries, APPEND, the cleaner's
//     moves) are refused with store.ErrUnavailable without touching the
//     disk; the others (expunges, deletions, flag changes) are small, free
//     space or both, and are committed into the reserve's room;
//   - if a log write failed all the same, the log's tail is unknown and
//     nothing is committed until the committer resumes it
//     (bodylog.Log.RecoverTail);
//   - the committer probes with a growing interval (probeMin to probeMax):
//     it resumes the log, and once the file system has room for the
//     reserve twice over it allocates the reserve again and leaves the
//     state. Writes that failed were never acknowledged, and were answered
//     with a temporary failure.
//
// Health reports the state (readiness false while not writable), the gauge
// quill_store_writable marks it, and entering and leaving it are logged.

const (
	// reserveName is the reserve's file in the engine's directory.
	reserveName = "reserve"
	// defaultReserveBytes is Options.ReserveBytes's default: room for the
	// flush of two memtables of the default size and the expunges of a
	// while, a small share of any disk a mail store lives on.
	defaultReserveBytes = 128 << 20
	probeMin            = 50 * time.Millisecond
	probeMax            = 2 * time.Second
)

// errDiskFull refuses a transaction that would store a body while the disk
// is full.
var errDiskFull = fmt.Errorf("embedded: disk full, not storing bodies: %w", store.ErrUnavailable)

// errNoRoom: the file system has less room than the reserve twice over.
var errNoRoom = errors.New("embedded: not enough free space for the reserve")

// space is the engine's disk-full state and its reserve. full is read by
// the committer once a group; the rest is under mu, never held across I/O
// (onDiskFull runs while every write of the engine waits for it).
type space struct {
	fs    vfs.FS // the file system beneath the OnDiskFull wrapper
	dir   string
	bytes int64
	log   *slog.Logger
	// wake tells the committer that the state was entered from another
	// goroutine, so that it starts probing.
	wake chan struct{}
	full atomic.Bool

	mu      sync.Mutex
	reason  string
	since   time.Time
	backoff time.Duration
	next    time.Time // the committer's next probe
}

func newSpace(fs vfs.FS, dir string, bytes int64, log *slog.Logger) *space {
	return &space{fs: fs, dir: dir, bytes: bytes, log: log, wake: make(chan struct{}, 1)}
}

// writableGauge is quill_store_writable, read from Health at scrape time.
func (e *Engine) writableGauge() prometheus.Collector {
	return prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "quill_store_writable",
		Help: "1 while the embedded store accepts writes; 0 while its disk is full (it refuses new mail and accepts deletions) or it has failed (see /healthz).",
	}, func() float64 {
		if e.Health().Writable {
			return 1
		}
		return 0
	})
}

// onDiskFull is vfs.OnDiskFull's callback: it releases the reserve and
// enters the full state. Every write through the wrapped file system waits
// while it runs.
func (sp *space) onDiskFull() {
	released := sp.bytes > 0
	if err := sp.fs.Remove(sp.fs.PathJoin(sp.dir, reserveName)); err != nil {
		released = false
		if !errors.Is(err, os.ErrNotExist) {
			sp.log.Error("store disk full: deleting the reserve failed", "err", err)
		}
	}
	sp.enter("no space left on device", released)
}

// enter puts the engine in the full state, if it is not already.
func (sp *space) enter(reason string, released bool) {
	sp.mu.Lock()
	if sp.full.Load() {
		sp.mu.Unlock()
		return
	}
	now := time.Now()
	sp.reason, sp.since, sp.backoff = reason, now, probeMin
	sp.next = now.Add(probeMin)
	sp.full.Store(true)
	sp.mu.Unlock()
	sp.log.Error("store disk full: refusing new mail until space is freed; deletions still accepted",
		"reason", reason, "reserve_released", released, "reserve_bytes", sp.bytes)
	select {
	case sp.wake <- struct{}{}:
	default:
	}
}

// due returns how long until the committer's next probe; false when the
// engine is not in the full state.
func (sp *space) due(now time.Time) (time.Duration, bool) {
	if !sp.full.Load() {
		return 0, false
	}
	sp.mu.Lock()
	defer sp.mu.Unlock()
	return sp.next.Sub(now), true
}

// retryLater schedules the next probe after a failed one.
func (sp *space) retryLater(err error) {
	sp.mu.Lock()
	defer sp.mu.Unlock()
	sp.backoff = min(2*sp.backoff, probeMax)
	sp.next = time.Now().Add(sp.backoff)
	sp.reason = err.Error()
}

// leave ends the full state.
func (sp *space) leave() {
	sp.mu.Lock()
	since := sp.since
	sp.reason = ""
	sp.full.Store(false)
	sp.mu.Unlock()
	sp.log.Info("store disk space available again: accepting new mail", "full_for", time.Since(since).Round(time.Millisecond))
}

// state returns the reason the engine is full, and since when; "" if not.
func (sp *space) state() (string, time.Time) {
	sp.mu.Lock()
	defer sp.mu.Unlock()
	if !sp.full.Load() {
		return "", time.Time{}
	}
	return sp.reason, sp.since
}

// makeReserve allocates the reserve, if the file system has room for it
// twice over (so that the reserve is not what fills it). A file system
// that cannot tell its free space is trusted to refuse the allocation.
func (sp *space) makeReserve() error {
	if sp.bytes <= 0 {
		return nil
	}
	// A reserve left by the last run is released first, so that the
	// free space counted includes it.
	name := sp.fs.PathJoin(sp.dir, reserveName)
	if err := sp.fs.Remove(name); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	if u, err := sp.fs.GetDiskUsage(sp.dir); err == nil && u.AvailBytes < 2*uint64(sp.bytes) {
		return fmt.Errorf("%w: %d bytes free, %d wanted", errNoRoom, u.AvailBytes, 2*sp.bytes)
	}
	f, err := sp.fs.Create(name, vfs.WriteCategoryUnspecified)
	if err != nil {
		return err
	}
	err = f.Preallocate(0, sp.bytes)
	if errors.Is(err, syscall.EOPNOTSUPP) {
		// A file system without fallocate: the reserve is written out.
		err = writeZeros(f, sp.bytes)
	}
	err = errors.Join(err, f.Sync(), f.Close())
	if err == nil {
		err = bodylog.SyncDir(sp.fs, sp.dir)
	}
	if err != nil {
		sp.fs.Remove(name)
		return fmt.Errorf("embedded: allocating the reserve: %w", err)
	}
	return nil
}

// writeZeros appends n zero bytes to f.
func writeZeros(f vfs.File, n int64) error {
	buf := make([]byte, min(n, 1<<20))
	for n > 0 {
		w := min(n, int64(len(buf)))
		if _, err := f.Write(buf[:w]); err != nil {
			return err
		}
		n -= w
	}
	return nil
}

// probeSpace, on the committer, tries to leave the full state when a probe
// is due: it resumes the log, then allocates the reserve again.
func (e *Engine) probeSpace() {
	sp := e.space
	if d, full := sp.due(time.Now()); !full || d > 0 {
		return
	}
	err := e.blog.RecoverTail()
	if err == nil {
		err = sp.makeReserve()
	}
	if err != nil {
		if logErr, noSpace := e.blog.Failure(); logErr != nil && !noSpace {
			// Final: Health reports it; probing would not help.
			sp.retryLater(logErr)
			return
		}
		sp.retryLater(err)
		return
	}
	sp.leave()
}

// flush flushes Pebble's memtables, giving up when the engine closes: on a
// full disk Pebble retries a failed flush until space is back.
func (e *Engine) flush() error {
	done, err := e.db.AsyncFlush()
	if err != nil {
		return err
	}
	select {
	case <-done:
		return nil
	case <-e.quit:
		return ErrClosed
	}
}

// Health reports whether the engine can write. Any goroutine.
func (e *Engine) Health() store.Health {
	if err, noSpace := e.blog.Failure(); err != nil && !noSpace {
		return store.Health{Failed: true, Reason: "body log failed, restart to recover: " + err.Error()}
	}
	if err := e.pend.Err(); err != nil {
		return store.Health{Failed: true, Reason: "checkpoint failed, restart to recover: " + err.Error()}
	}
	if reason, since := e.space.state(); !since.IsZero() {
		return store.Health{Reason: fmt.Sprintf("disk full since %s (%s): refusing new mail, accepting deletions",
			since.UTC().Format(time.RFC3339), reason)}
	}
	return store.Health{Writable: true}
}

var _ store.HealthReporter = (*Engine)(nil)
