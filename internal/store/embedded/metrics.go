package embedded

import (
	"log/slog"
	"strconv"
	"sync"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/prometheus/client_golang/prometheus"
)

// The store's health as an operator sees it: how much disk it holds, how
// far compactions lag behind the writes (Pebble stalls writes, and so
// deliveries, when level 0 grows too deep), how many bytes it writes per
// byte delivered, and whether the disk is slow. Everything but the stall
// counters is read from pebble.Metrics at scrape time.

var (
	descDiskBytes = prometheus.NewDesc("quill_store_disk_bytes",
		"Bytes the embedded store holds on disk (body log, tables, manifest), live and not yet deleted.", nil, nil)
	descLogBytes = prometheus.NewDesc("quill_store_log_bytes",
		"Bytes of the body log's segments on disk.", nil, nil)
	descLogLiveBytes = prometheus.NewDesc("quill_store_log_live_bytes",
		"Bytes of the bodies in the log that messages still reference; the rest is reclaimed by the cleaner.", nil, nil)
	descLogSegments = prometheus.NewDesc("quill_store_log_segments",
		"Segment files of the body log.", nil, nil)
	descLogRemoved = prometheus.NewDesc("quill_store_log_segments_deleted_total",
		"Body log segments the cleaner deleted since the store was opened.", nil, nil)
	descLogMoved = prometheus.NewDesc("quill_store_log_moved_bytes_total",
		"Bytes of live bodies the cleaner copied forward out of sparse segments since the store was opened.", nil, nil)
	descLevelBytes = prometheus.NewDesc("quill_store_level_bytes",
		"Bytes of the tables in each level of the embedded store's LSM.", []string{"level"}, nil)
	descL0Sublevels = prometheus.NewDesc("quill_store_l0_sublevels",
		"Sublevels in level 0: writes stall when they reach Pebble's L0StopWritesThreshold (12).", nil, nil)
	descReadAmp = prometheus.NewDesc("quill_store_read_amplification",
		"Tables a point read may have to consult (level 0 sublevels plus non-empty levels).", nil, nil)
	descDebt = prometheus.NewDesc("quill_store_compaction_debt_bytes",
		"Bytes compactions would have to rewrite to bring every level back to its target size.", nil, nil)
	descCompactions = prometheus.NewDesc("quill_store_compactions_total",
		"Compactions completed since the store was opened.", nil, nil)
	descFlushes = prometheus.NewDesc("quill_store_flushes_total",
		"Memtable flushes completed since the store was opened.", nil, nil)
	descWritten = prometheus.NewDesc("quill_store_written_bytes_total",
		"Bytes the store wrote since it was opened, by kind: wal (the body log every commit is synced to), flush (memtables to tables) and compaction (tables rewritten). (flush + compaction) / wal is the write amplification.",
		[]string{"kind"}, nil)
	descCacheHits = prometheus.NewDesc("quill_store_block_cache_hits_total",
		"Block cache hits since the store was opened.", nil, nil)
	descCacheMisses = prometheus.NewDesc("quill_store_block_cache_misses_total",
		"Block cache misses since the store was opened (each one a read from a table file).", nil, nil)
	descCacheBytes = prometheus.NewDesc("quill_store_block_cache_bytes",
		"Bytes held by the block cache (store.cache_bytes bounds it).", nil, nil)
	descMemtableBytes = prometheus.NewDesc("quill_store_memtable_bytes",
		"Bytes held by memtables, including those waiting for a flush or for their readers.", nil, nil)
	descOverlayBytes = prometheus.NewDesc("quill_store_overlay_bytes",
		"Bytes of durable writes waiting in memory for the next checkpoint to apply them to the tables.", nil, nil)
	descOverlayRecords = prometheus.NewDesc("quill_store_overlay_records_total",
		"Records that left the overlay since the store was opened: applied by a checkpoint, or cancelled (written and deleted between two checkpoints, so never applied).",
		[]string{"outcome"}, nil)
)

// pebbleCollector exports pebble.Metrics. It stops reporting once the
// engine is closed: Close takes closeMu for writing, so a scrape holding it
// for reading finishes before the database closes.
type pebbleCollector struct{ e *Engine }

func (c pebbleCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descDiskBytes, descLogBytes, descLogLiveBytes, descLogSegments, descLogRemoved, descLogMoved, descLevelBytes, descL0Sublevels, descReadAmp,
		descDebt, descCompactions, descFlushes, descWritten, descCacheHits, descCacheMisses,
		descCacheBytes, descMemtableBytes, descOverlayBytes, descOverlayRecords} {
		ch <- d
	}
}

func (c pebbleCollector) Collect(ch chan<- prometheus.Metric) {
	c.e.closeMu.RLock()
	defer c.e.closeMu.RUnlock()
	if c.e.closed {
		return
	}
	m := c.e.db.Metrics()
	gauge := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
	}
	counter := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, v, labels...)
	}
	ls := c.e.blog.Stats()
	gauge(descDiskBytes, float64(m.DiskSpaceUsage())+float64(ls.Size))
	gauge(descLogBytes, float64(ls.Size))
	gauge(descLogLiveBytes, float64(ls.Live))
	gauge(descLogSegments, float64(ls.Segments))
	counter(descLogRemoved, float64(ls.Removed))
	counter(descLogMoved, float64(ls.Moved))
	var flushed, compacted uint64
	for i, l := range m.Levels {
		gauge(descLevelBytes, float64(l.TablesSize), strconv.Itoa(i))
		flushed += l.TableBytesFlushed + l.BlobBytesFlushed
		compacted += l.TableBytesCompacted + l.BlobBytesCompacted
	}
	gauge(descL0Sublevels, float64(m.Levels[0].Sublevels))
	gauge(descReadAmp, float64(m.ReadAmp()))
	gauge(descDebt, float64(m.Compact.EstimatedDebt))
	counter(descCompactions, float64(m.Compact.Count))
	counter(descFlushes, float64(m.Flush.Count))
	counter(descWritten, float64(ls.Written), "wal")
	counter(descWritten, float64(flushed), "flush")
	counter(descWritten, float64(compacted), "compaction")
	counter(descCacheHits, float64(m.BlockCache.Hits))
	counter(descCacheMisses, float64(m.BlockCache.Misses))
	gauge(descCacheBytes, float64(m.BlockCache.Size))
	gauge(descMemtableBytes, float64(m.MemTable.Size))
	o := c.e.pend.Stats()
	gauge(descOverlayBytes, float64(o.Bytes))
	counter(descOverlayRecords, float64(o.Applied), "applied")
	counter(descOverlayRecords, float64(o.Cancelled), "cancelled")
}

// stallMeter counts Pebble's write stalls: while one lasts, every commit
// group, and so every delivery's acknowledgement, waits.
type stallMeter struct {
	count   prometheus.Counter
	seconds prometheus.Counter

	mu    sync.Mutex
	began time.Time // zero when no stall is under way
}

func newStallMeter() *stallMeter {
	return &stallMeter{
		count: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "quill_store_write_stalls_total",
			Help: "Write stalls of the embedded store: compactions fell behind and commits waited.",
		}),
		seconds: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "quill_store_write_stall_seconds_total",
			Help: "Time the embedded store's commits spent stalled.",
		}),
	}
}

// begin and end are Pebble's WriteStallBegin and WriteStallEnd; Pebble
// calls them in pairs, begin first.
func (s *stallMeter) begin(now time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.count.Inc()
	s.began = now
}

// end returns how long the stall lasted (0 if none was under way).
func (s *stallMeter) end(now time.Time) time.Duration {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.began.IsZero() {
		return 0
	}
	d := now.Sub(s.began)
	s.began = time.Time{}
	s.seconds.Add(d.Seconds())
	return d
}

// eventListener reports the events an operator must hear of: write stalls,
// slow disk operations and low disk space (background errors already reach
// the log through pebbleLogger).
func eventListener(log *slog.Logger, stalls *stallMeter) *pebble.EventListener {
	return &pebble.EventListener{
		WriteStallBegin: func(info pebble.WriteStallBeginInfo) {
			stalls.begin(time.Now())
			log.Warn("store write stall: deliveries wait until compactions catch up", "reason", info.Reason)
		},
		WriteStallEnd: func() {
			d := stalls.end(time.Now())
			log.Info("store write stall ended", "duration", d)
		},
		DiskSlow: func(info pebble.DiskSlowInfo) {
			log.Warn("store disk slow", "detail", info.String())
		},
		LowDiskSpace: func(info pebble.LowDiskSpaceInfo) {
			log.Warn("store disk space low", "detail", info.String())
		},
	}
}
