package embedded

import (
	"io"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"quill/internal/store"
	"quill/internal/store/storetest"
)

// gathered returns every sample of reg by name and label values
// ("quill_store_written_bytes_total{wal}").
func gathered(t *testing.T, reg *prometheus.Registry) map[string]float64 {
	t.Helper()
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, f := range fams {
		for _, m := range f.GetMetric() {
			name := f.GetName()
			if ls := m.GetLabel(); len(ls) > 0 {
				var vals []string
				for _, l := range ls {
					vals = append(vals, l.GetValue())
				}
				name += "{" + strings.Join(vals, ",") + "}"
			}
			switch {
			case m.GetCounter() != nil:
				out[name] = m.GetCounter().GetValue()
			case m.GetGauge() != nil:
				out[name] = m.GetGauge().GetValue()
			case m.GetHistogram() != nil:
				out[name+"_count"] = float64(m.GetHistogram().GetSampleCount())
			}
		}
	}
	return out
}

// TestStoreMetrics: the exported figures follow what the store did, and a
// scrape after Close reports nothing rather than touching a closed database.
func TestStoreMetrics(t *testing.T) {
	reg := prometheus.NewRegistry()
	// Without the list cache, so that a listing reads Pebble's tables.
	e, err := Open(t.TempDir(), Options{Registerer: reg, ListCacheBytes: -1})
	if err != nil {
		t.Fatal(err)
	}
	before := gathered(t, reg)
	if before["quill_store_flushes_total"] != 0 || before["quill_store_level_bytes{0}"] != 0 {
		t.Fatalf("a new store reports flushes or tables: %v", before)
	}

	inbox := storetest.UserInbox(t, e, "metrics@example.test")
	body := strings.Repeat("x", 64<<10)
	const n = 40
	var last store.Message
	for range n {
		last = appendOne(t, e, inbox.ID, body)
	}
	if err := e.checkpoint("test"); err != nil {
		t.Fatal(err)
	}
	if err := e.db.Flush(); err != nil {
		t.Fatal(err)
	}
	// Listing the mailbox after the flush reads its message records from a
	// table, through the block cache. (The bodies are in the log, and their
	// blob records come from the committer's cache.)
	if msgs, err := e.ListMessages(t.Context(), inbox.ID, 1, n+1); err != nil || len(msgs) != n {
		t.Fatalf("listing after the flush: %d messages, %v", len(msgs), err)
	}
	r, err := e.OpenBlob(t.Context(), last.Blob)
	if err != nil {
		t.Fatal(err)
	}
	if got, err := io.ReadAll(r); err != nil || string(got) != body {
		t.Fatalf("reading the body back: %d bytes, %v", len(got), err)
	}
	r.Close()
	after := gathered(t, reg)
	if got := after["quill_store_written_bytes_total{wal}"]; got < n*float64(len(body)) {
		t.Errorf("wal bytes %v, want at least the %d bodies' %d bytes", got, n, n*len(body))
	}
	var checkpoints float64
	for name, v := range after {
		if strings.HasPrefix(name, "quill_store_checkpoints_total{") {
			checkpoints += v
		}
	}
	if got := after["quill_store_checkpoint_seconds_count"]; checkpoints == 0 || got != checkpoints {
		t.Errorf("%v checkpoints timed, %v counted", got, checkpoints)
	}
	if after["quill_store_flushes_total"] < 1 {
		t.Errorf("flushes %v after a flush", after["quill_store_flushes_total"])
	}
	if after["quill_store_written_bytes_total{flush}"] == 0 {
		t.Errorf("no flush bytes after flushing %d bodies", n)
	}
	var tables float64
	for l := range 7 {
		tables += after["quill_store_level_bytes{"+string(rune('0'+l))+"}"]
	}
	if tables == 0 {
		t.Errorf("no table bytes in any level after a flush: %v", after)
	}
	if got := after["quill_store_disk_bytes"]; got < tables {
		t.Errorf("disk bytes %v below the tables' %v", got, tables)
	}
	if after["quill_store_read_amplification"] < 1 {
		t.Errorf("read amplification %v with tables on disk", after["quill_store_read_amplification"])
	}
	if after["quill_store_block_cache_hits_total"]+after["quill_store_block_cache_misses_total"] == 0 {
		t.Errorf("a listing read from a table touched no block: %v", after)
	}

	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	closed := gathered(t, reg)
	if _, ok := closed["quill_store_disk_bytes"]; ok {
		t.Errorf("a closed store still reports disk bytes")
	}
	if _, ok := closed["quill_store_write_stalls_total"]; !ok {
		t.Errorf("the stall counters are gone after Close: %v", closed)
	}
}

// TestStallMeter: a stall is counted when it begins and its length when it
// ends; an end without a begin adds nothing.
func TestStallMeter(t *testing.T) {
	s := newStallMeter()
	reg := prometheus.NewRegistry()
	reg.MustRegister(s.count, s.seconds)
	if d := s.end(time.Now()); d != 0 {
		t.Fatalf("end without begin: %v", d)
	}
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	s.begin(t0)
	if got := gathered(t, reg)["quill_store_write_stalls_total"]; got != 1 {
		t.Fatalf("stalls %v while the first is under way", got)
	}
	if d := s.end(t0.Add(1500 * time.Millisecond)); d != 1500*time.Millisecond {
		t.Fatalf("stall lasted %v", d)
	}
	s.begin(t0.Add(time.Minute))
	s.end(t0.Add(time.Minute + 250*time.Millisecond))
	g := gathered(t, reg)
	if g["quill_store_write_stalls_total"] != 2 || g["quill_store_write_stall_seconds_total"] != 1.75 {
		t.Fatalf("after stalls of 1.5 s and 0.25 s: %v", g)
	}
}
