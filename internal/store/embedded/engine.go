// Package embedded is Quill's single-node storage engine: metadata in a
// Pebble database and message bodies in an append-only log beside it, on
// local disk.
//
// Writes and durability. Every mutation runs as a transaction function on a
// single committer goroutine, which gathers all transactions queued while
// the previous group was being synced into one Pebble batch and commits it
// with one fsync (group commit):
//
//	loop:
//	    group := wait for one request, then take every request queued
//	    for each request: run its function against the group's batch;
//	                      keep its writes only if it succeeded
//	    fence every mailbox the group touched at its pre-group state
//	    append the group's bodies and batch to the log as one record; fdatasync
//	    fold the batch's writes into the overlay (checkpoint.go, package
//	    overlay);
//	    update the caches (hot.go, lists.go)
//	    lift the fences; answer every request
//
// While the disk is full (space.go) the committer refuses transactions that
// store a body, and wakes with a backoff to probe whether space is back.
//
// The log is the write-ahead log (package bodylog): Pebble runs without
// its own, and a group reaches the overlay only once its record is
// durable, so nothing a reader sees can be lost by a crash. A checkpoint
// applies the overlay's net effect to Pebble every few seconds.
//
// The user manager assigns UIDs and MODSEQs (package usermgr); the
// committer applies its batches in the order they were submitted, each
// only if its assertions hold against the stored heads (batch.go), so they
// are strictly increasing in commit order. Between applying a group and
// updating the caches, a mailbox record read from the cache and the
// messages read through the overlay could disagree, so readers clamp what
// they see of a fenced mailbox to its pre-group state. What the engine
// keeps beneath the manager, and why: ADR 0039.
//
// Rejected alternative: a lock per mailbox held across the commit. It
// serializes a hot mailbox at one fsync per message; the committer instead
// puts a whole group of deliveries to that mailbox into one fsync.
//
// A body given inline to Append (store.NewMessage.Body) goes into the log
// with its one reference, in the same record. PutBlob stores a body on its
// own (in the log if it fits one chunk, in chunks in Pebble if larger) and
// marks it pending until its first reference; pending blobs are reclaimed
// at open and periodically.
package embedded

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/bloom"
	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/prometheus/client_golang/prometheus"

	"quill/internal/store"
	"quill/internal/store/embedded/bodylog"
	"quill/internal/store/embedded/overlay"
)

// ErrClosed is returned by operations on a closed engine.
var ErrClosed = errors.New("embedded: engine closed")

// Options configure an engine.
type Options struct {
	Logger     *slog.Logger
	Registerer prometheus.Registerer
	// CacheBytes is Pebble's block cache size (default 64 MiB).
	CacheBytes int64
	// MemTableBytes is the size of one memtable (default 32 MiB); tests
	// lower it to exercise WAL rotation and flushes.
	MemTableBytes uint64
	// MaxGroup bounds the transactions in one commit group (default 1024).
	MaxGroup int
	// PendingBlobTTL is how long an unreferenced blob may live before it is
	// reclaimed (default 1 h): it must exceed the longest delivery.
	PendingBlobTTL time.Duration
	// FS is the filesystem (default: the operating system's). Tests pass a
	// crashable in-memory one to simulate losing everything not synced.
	FS vfs.FS
	// LogSegmentBytes is the size of one segment of the body log (default
	// 64 MiB); tests lower it to exercise rotation and cleaning.
	LogSegmentBytes int64
	// LogIndexBlobs bounds the blobs the log index keeps in memory
	// (default 2 Mi, about 80 MB at 38 bytes each): past it, the oldest
	// sealed segments' indexes move into Pebble (package bodylog, "Space").
	LogIndexBlobs int
	// ExpungeWindow is how many MODSEQs of expunges a mailbox's change log
	// keeps at least (default 1024): older ones are forgotten (see
	// pruneExpunges), so the log follows a mailbox's size and recent
	// activity, not every message it ever held.
	ExpungeWindow uint64
	// ListCacheBytes bounds the memory that holds active mailboxes'
	// message records (listCache; default 32 MiB, negative disables it).
	ListCacheBytes int
	// CheckpointInterval is how long a durable write may wait in memory
	// before a checkpoint applies it to Pebble (default 5 s; see
	// checkpoint.go). Recovery replays at most about that much of the log.
	CheckpointInterval time.Duration
	// CheckpointBytes starts a checkpoint early once the writes waiting
	// hold that many bytes (default 64 MiB).
	CheckpointBytes int
	// ReserveBytes is the space kept allocated for a full disk (default
	// 128 MiB, negative for none): released when a write meets ENOSPC, it
	// leaves room for deletions and Pebble's flushes (space.go).
	ReserveBytes int64
}

// Engine is the embedded store. It implements store.Store.
type Engine struct {
	db   *pebble.DB
	blog *bodylog.Log
	opts Options
	log  *slog.Logger

	reqs chan *request
	quit chan struct{}
	wg   sync.WaitGroup
	// closeMu orders enqueueing against Close: once Close holds it for
	// writing, no request can be queued that the committer would not drain.
	closeMu sync.RWMutex
	closed  bool

	// hot and blobs are written by the committer only (hotCache, blobCache).
	hot   *hotCache
	blobs *blobCache
	// lists is written by the committer only (listCache).
	lists *listCache
	// users is GetUser's memo of decoded records (decodedUser).
	users bounded[string, decodedUser]
	// txn is the committer's, reused by every group (commitGroup).
	txn *txn
	// inboxes is GetMailbox's memory of where users' INBOXes are.
	// inboxes remembers the ID of users' INBOXes for GetMailbox, which every
	// POP3 login calls: the name record it spares is never in a cache (only
	// the committer's records are) and rarely in a memtable, so its lookup
	// searched every memtable and level. An entry is a hint, filled by any
	// reader and never invalidated: GetMailbox reads the mailbox record it
	// names anyway, and uses it only if that record is still the user's
	// INBOX. That check suffices because mailbox IDs are never reused and an
	// INBOX is neither renamed nor deleted while its user exists: a record
	// that names the user and INBOX is the user's current INBOX. Otherwise
	// (the user deleted, or deleted and re-created) the name record decides.
	inboxes *store.InboxIDs
	// pend holds durable writes not yet applied to Pebble (checkpoint.go).
	pend     *overlay.Overlay
	ckptWake chan struct{}

	// space is the disk-full state and the reserve (space.go).
	space *space
	// cleaning serializes the log cleaner's passes, and Check with them
	// (cleanLog).
	cleaning sync.Mutex

	fenceMu sync.RWMutex
	fence   map[store.ID]store.Mailbox // mailboxes in the group being synced, pre-group state

	drops maildropLocks // POP3 maildrop leases (maildrop.go)
	owner ownership     // cluster map epochs and node leases (ownership.go)

	commitLatency prometheus.Histogram
	groupSize     prometheus.Histogram
	stalls        *stallMeter
	checkpointsBy *prometheus.CounterVec
	ckptSeconds   prometheus.Histogram
}

var _ store.Engine = (*Engine)(nil)

// Open opens (creating if needed) the engine in dir.
func Open(dir string, opts Options) (*Engine, error) {
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	if opts.CacheBytes == 0 {
		opts.CacheBytes = 64 << 20
	}
	if opts.MemTableBytes == 0 {
		opts.MemTableBytes = 32 << 20
	}
	if opts.MaxGroup == 0 {
		opts.MaxGroup = 1024
	}
	if opts.PendingBlobTTL == 0 {
		opts.PendingBlobTTL = time.Hour
	}
	if opts.FS == nil {
		opts.FS = vfs.Default
	}
	if opts.ExpungeWindow == 0 {
		opts.ExpungeWindow = 1024
	}
	if opts.CheckpointInterval <= 0 {
		opts.CheckpointInterval = checkpointInterval
	}
	if opts.CheckpointBytes <= 0 {
		opts.CheckpointBytes = checkpointBytes
	}
	if opts.LogSegmentBytes == 0 {
		opts.LogSegmentBytes = defaultSegmentBytes
	}
	switch {
	case opts.ReserveBytes == 0:
		opts.ReserveBytes = defaultReserveBytes
	case opts.ReserveBytes < 0:
		opts.ReserveBytes = 0
	}
	if opts.LogIndexBlobs <= 0 {
		opts.LogIndexBlobs = logIndexBlobs
	}
	switch {
	case opts.ListCacheBytes == 0:
		opts.ListCacheBytes = listCacheBytes
	case opts.ListCacheBytes < 0:
		opts.ListCacheBytes = 0
	}
	if err := opts.FS.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	// Pebble and the log write through fs, whose first ENOSPC releases
	// the reserve (space.go).
	sp := newSpace(opts.FS, dir, opts.ReserveBytes, opts.Logger)
	fs := vfs.OnDiskFull(opts.FS, sp.onDiskFull)
	cache := pebble.NewCache(opts.CacheBytes)
	defer cache.Unref()
	stalls := newStallMeter()
	popts := &pebble.Options{
		Cache:         cache,
		MemTableSize:  opts.MemTableBytes,
		Logger:        pebbleLogger{opts.Logger},
		EventListener: eventListener(opts.Logger, stalls),
		FS:            fs,
		// The body log is the write-ahead log (package bodylog).
		DisableWAL: true,
	}
	// Bloom filters: most lookups that miss (alias checks, pending marks,
	// unknown users) then cost no table reads.
	for i := range popts.Levels {
		popts.Levels[i].FilterPolicy = bloom.FilterPolicy(10)
	}
	db, err := pebble.Open(filepath.Join(dir, "pebble"), popts)
	if err != nil {
		return nil, fmt.Errorf("embedded: open %s: %w", dir, err)
	}
	blog, err := bodylog.Open(fs, filepath.Join(dir, "log"), opts.LogSegmentBytes)
	if err != nil {
		db.Close()
		return nil, fmt.Errorf("embedded: open %s: %w", dir, err)
	}
	e := &Engine{
		db:       db,
		blog:     blog,
		opts:     opts,
		log:      opts.Logger,
		reqs:     make(chan *request, opts.MaxGroup),
		quit:     make(chan struct{}),
		fence:    make(map[store.ID]store.Mailbox),
		hot:      newHotCache(hotCacheEntries),
		inboxes:  store.NewInboxIDs(hotCacheEntries),
		users:    newBounded[string, decodedUser](hotCacheEntries),
		blobs:    newBlobCache(blobCacheEntries),
		lists:    newListCache(opts.ListCacheBytes),
		pend:     overlay.New(keySchema),
		space:    sp,
		ckptWake: make(chan struct{}, 1),
		stalls:   stalls,
		checkpointsBy: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "quill_store_checkpoints_total",
			Help: "Checkpoints of the embedded store, by what started them.",
		}, []string{"reason"}),
		ckptSeconds: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "quill_store_checkpoint_seconds",
			Help:    "Time one checkpoint of the embedded store took to apply the overlay to its tables.",
			Buckets: prometheus.ExponentialBuckets(0.001, 2, 14),
		}),
		commitLatency: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "quill_store_commit_seconds",
			Help:    "Latency of one synced commit group of the embedded store.",
			Buckets: prometheus.ExponentialBuckets(0.0001, 2, 16),
		}),
		groupSize: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "quill_store_commit_group_size",
			Help:    "Transactions per commit group of the embedded store.",
			Buckets: prometheus.ExponentialBuckets(1, 2, 11),
		}),
	}
	e.txn = &txn{
		e:        e,
		own:      make(map[string]int),
		touched:  make(map[store.ID]store.Mailbox),
		grouped:  make(map[string][]byte),
		messages: make(map[string][]byte),
	}
	if err := e.recover(dir); err != nil {
		blog.Close()
		db.Close()
		return nil, err
	}
	// A store opened on a full disk serves reads and deletions.
	if err := sp.makeReserve(); err != nil {
		sp.enter(err.Error(), false)
	}
	if opts.Registerer != nil {
		for _, c := range []prometheus.Collector{e.commitLatency, e.groupSize,
			e.stalls.count, e.stalls.seconds, e.checkpointsBy, e.ckptSeconds, pebbleCollector{e}, e.writableGauge()} {
			if err := opts.Registerer.Register(c); err != nil {
				blog.Close()
				db.Close()
				return nil, err
			}
		}
	}
	e.wg.Add(4)
	go e.commitLoop()
	go e.sweepLoop()
	go e.cleanLoop()
	go e.checkpointLoop()
	return e, nil
}

// recover brings the database up to the end of the log, and the schema up
// to this binary's level, before the committer starts.
func (e *Engine) recover(dir string) error {
	var from bodylog.Pos
	v, err := e.get(e.db, []byte{tLogPos})
	switch {
	case err == nil:
		if from, err = bodylog.DecodePos(v); err != nil {
			return fmt.Errorf("embedded: log position: %w", err)
		}
	case !errors.Is(err, store.ErrNotFound):
		return err
	}
	if err := e.blog.Replay(e.db, from); err != nil {
		return err
	}
	// Pebble syncs the directories inside its own, and the log syncs its
	// own; the entries that lead to them must be durable too, or a power
	// loss soon after the first start could lose the whole store.
	if err := syncDirChain(e.opts.FS, filepath.Join(dir, "log")); err != nil {
		return fmt.Errorf("embedded: syncing %s: %w", dir, err)
	}
	if err := e.checkVersion(); err != nil {
		return err
	}
	// Counted first, so that the reclaimed blobs' bodies are subtracted
	// from their segments' counts rather than from nothing.
	if err := e.countLive(); err != nil {
		return err
	}
	return e.reclaimPending(0)
}

// runNow commits fn as a group of its own on the calling goroutine; only
// while the committer is not running (at open).
func (e *Engine) runNow(fn func(*txn) error) error {
	r := &request{fn: fn, done: make(chan struct{})}
	e.commitGroup([]*request{r})
	return r.err
}

// syncDirChain fsyncs every directory from path's parent up to the root, so
// that the entries naming path and its ancestors are durable.
func syncDirChain(fs vfs.FS, path string) error {
	for dir := filepath.Dir(path); ; dir = filepath.Dir(dir) {
		if err := bodylog.SyncDir(fs, dir); err != nil {
			return err
		}
		if parent := filepath.Dir(dir); parent == dir {
			return nil
		}
	}
}

func (e *Engine) checkVersion() error {
	v, err := e.read([]byte{tVersion})
	if err != nil && !errors.Is(err, store.ErrNotFound) {
		return err
	}
	switch {
	case len(v) == 1 && v[0] == schemaLevel:
		return nil
	case errors.Is(err, store.ErrNotFound), len(v) == 1 && (v[0] == 1 || v[0] == 2):
		// A new store; or level 1, whose chunk-stored bodies this level
		// still reads; or level 2, whose segments are all frozen.
		return e.runNow(func(t *txn) error {
			t.set([]byte{tVersion}, []byte{schemaLevel})
			return nil
		})
	}
	return fmt.Errorf("embedded: data has schema level %v, this binary knows %d", v, schemaLevel)
}

// Close stops the committer after the queued transactions and closes the
// database.
func (e *Engine) Close() error {
	e.closeMu.Lock()
	if e.closed {
		e.closeMu.Unlock()
		return nil
	}
	e.closed = true
	close(e.quit)
	e.closeMu.Unlock()
	e.wg.Wait()
	// A checkpoint and a flush make the next open replay nothing; without
	// them the log still holds every acknowledged change. On a full disk
	// Pebble retries a failed flush until space is back, so Close skips
	// them rather than wait.
	if e.space.full.Load() {
		e.log.Warn("closing the store on a full disk: the next open replays the log since the last checkpoint")
	} else if err := e.checkpoint("close"); err != nil {
		e.log.Warn("checkpointing the store at close", "err", err)
	} else if err := e.db.Flush(); err != nil {
		e.log.Warn("flushing the store at close", "err", err)
	}
	e.blog.Close()
	return e.db.Close()
}

// request is one transaction queued for the committer.
type request struct {
	fn   func(*txn) error
	err  error
	done chan struct{}
}

// update runs fn exactly once, on the committer goroutine, in the next commit
// group, and returns once that group is durable (or fn failed). fn must not
// block; when it returns an error none of its writes are kept.
func (e *Engine) update(ctx context.Context, fn func(*txn) error) error {
	r, err := e.submit(ctx, fn)
	if err != nil {
		return err
	}
	// Once queued the transaction may commit: wait for its outcome even if
	// ctx ends, or the caller could report failure for a durable change.
	return r.wait()
}

// submit queues fn for the committer without waiting for it. Transactions
// run in the order they were queued, so one queued later by the same
// goroutine sees fn's writes (or fails with it: see commitGroup).
func (e *Engine) submit(ctx context.Context, fn func(*txn) error) (*request, error) {
	r := &request{fn: fn, done: make(chan struct{})}
	e.closeMu.RLock()
	defer e.closeMu.RUnlock()
	if e.closed {
		return nil, ErrClosed
	}
	// The committer keeps taking requests until quit, so this send cannot
	// block forever while closeMu is held.
	select {
	case e.reqs <- r:
		return r, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

func (r *request) wait() error {
	<-r.done
	return r.err
}

func (e *Engine) commitLoop() {
	defer e.wg.Done()
	group := make([]*request, 0, e.opts.MaxGroup)
	for {
		// While the disk is full the committer also wakes to probe
		// whether space is back (space.go).
		var probe <-chan time.Time
		var timer *time.Timer
		if d, full := e.space.due(time.Now()); full {
			timer = time.NewTimer(max(d, 0))
			probe = timer.C
		}
		var first *request
		select {
		case first = <-e.reqs:
		case <-probe:
		case <-e.space.wake:
		case <-e.quit:
			// Drain what was queued before Close so no caller hangs.
			for {
				select {
				case r := <-e.reqs:
					e.commitGroup([]*request{r})
				default:
					return
				}
			}
		}
		if timer != nil {
			timer.Stop()
		}
		e.probeSpace()
		if first == nil {
			continue
		}
		group = append(group[:0], first)
	fill:
		for len(group) < e.opts.MaxGroup {
			select {
			case r := <-e.reqs:
				group = append(group, r)
			default:
				break fill
			}
		}
		e.commitGroup(group)
	}
}

// commitGroup runs a group's transactions into one batch, writes the batch
// and the group's bodies to the log as one record, syncs it and only then
// folds the group's writes into the overlay (a group with a range delete:
// applies the batch to Pebble): nothing a group wrote is visible before it
// is durable.
func (e *Engine) commitGroup(group []*request) {
	b := e.db.NewBatch()
	defer b.Close()
	t := e.txn
	t.reset(b)
	pos, err := e.blog.Begin()
	full := e.space.full.Load()
	ok := 0
	for _, r := range group {
		if err != nil {
			break
		}
		t.begin()
		r.err = safeRun(r.fn, t)
		if r.err == nil && full && t.stored {
			r.err = errDiskFull
		}
		if r.err != nil {
			t.rollback()
			continue
		}
		t.apply()
		ok++
	}
	if ok > 0 {
		start := time.Now()
		e.fenceMu.Lock()
		for id, m := range t.touched {
			e.fence[id] = m
		}
		e.fenceMu.Unlock()
		lp := pos.Encode()
		if err = e.pend.Err(); err == nil {
			err = b.Set([]byte{tLogPos}, lp, nil)
		}
		if err == nil {
			err = e.blog.Commit(b.Repr())
		}
		switch {
		case err != nil:
		case t.direct:
			// A range delete: the overlay was applied before it
			// (txn.apply), and the group follows it into Pebble.
			if err = b.Commit(pebble.NoSync); err != nil {
				// The log holds a change Pebble does not: only a
				// recovery can reconcile them (%v: never resumed as a
				// lack of space).
				e.blog.Fail(fmt.Errorf("embedded: applying a logged group: %v", err))
			}
		default:
			e.pend.Merge(append(t.written, overlay.Write{Key: []byte{tLogPos}, Value: lp}))
		}
		// The caches take the group's values before the fences lift,
		// so that no reader sees them disagree (hotCache).
		if err != nil {
			e.hot.reset()
			e.blobs.reset()
			e.lists.reset()
		} else {
			for k, v := range t.grouped {
				if c := e.cacheFor(k[0]); c != nil {
					c.put(k, v)
				} else if id, ok := blobOfKey(k); ok {
					e.blobs.put(id, v)
				}
			}
			e.lists.commit(t.touched, t.messages)
			e.blog.AddLive(t.deltas)
		}
		e.fenceMu.Lock()
		for id := range t.touched {
			delete(e.fence, id)
		}
		e.fenceMu.Unlock()
		e.commitLatency.Observe(time.Since(start).Seconds())
		e.groupSize.Observe(float64(ok))
		if err == nil && e.pend.Due(e.opts.CheckpointInterval, e.opts.CheckpointBytes) {
			select {
			case e.ckptWake <- struct{}{}:
			default:
			}
		}
	}
	switch {
	case err == nil:
	case bodylog.IsNoSpace(err):
		// Logged once, by enter; the group is answered with a
		// temporary failure, and nothing of it was acknowledged.
		e.space.enter(err.Error(), false)
		err = fmt.Errorf("embedded: commit: %w: %w", store.ErrUnavailable, err)
	default:
		e.log.Error("store commit failed", "err", err, "group", len(group))
		err = fmt.Errorf("embedded: commit: %w", err)
	}
	for _, r := range group {
		if r.err == nil && err != nil {
			r.err = err
		}
		close(r.done)
	}
}

// safeRun runs a transaction function, turning a panic into an error so a
// bug in one transaction cannot take the committer down with the others.
func safeRun(fn func(*txn) error, t *txn) (err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("embedded: transaction panicked: %v", p)
		}
	}()
	return fn(t)
}

// fenced returns the pre-group state of a mailbox whose group is being
// synced. A reader must consult it after reading from the database (see the
// package comment).
func (e *Engine) fenced(id store.ID) (store.Mailbox, bool) {
	e.fenceMu.RLock()
	m, ok := e.fence[id]
	e.fenceMu.RUnlock()
	return m, ok
}

// get returns a copy of the value at k, or store.ErrNotFound.
func (e *Engine) get(r pebble.Reader, k []byte) ([]byte, error) {
	v, closer, err := r.Get(k)
	if errors.Is(err, pebble.ErrNotFound) {
		return nil, store.ErrNotFound
	}
	if err != nil {
		return nil, err
	}
	out := append([]byte(nil), v...)
	closer.Close()
	return out, nil
}

func (e *Engine) sweepLoop() {
	defer e.wg.Done()
	tick := time.NewTicker(e.opts.PendingBlobTTL / 4)
	defer tick.Stop()
	for {
		select {
		case <-e.quit:
			return
		case <-tick.C:
			if err := e.reclaimPending(e.opts.PendingBlobTTL); err != nil {
				e.log.Warn("reclaiming unreferenced blobs", "err", err)
			}
		}
	}
}

type pebbleLogger struct{ l *slog.Logger }

func (p pebbleLogger) Infof(format string, args ...any) {
	p.l.Debug(fmt.Sprintf(format, args...), "component", "pebble")
}
func (p pebbleLogger) Errorf(format string, args ...any) {
	p.l.Error(fmt.Sprintf(format, args...), "component", "pebble")
}
func (p pebbleLogger) Fatalf(format string, args ...any) {
	p.l.Error(fmt.Sprintf(format, args...), "component", "pebble")
	os.Exit(1)
}
