package main

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"quill/internal/loadgen"
)

// TestDiskProbeSyncs: the probe makes its block durable on a real file and
// summarises what it measured; started and finished, it summarises only
// the samples since its start.
func TestDiskProbeSyncs(t *testing.T) {
	p, err := newDiskProbe(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer p.close()
	for range 5 {
		p.syncOnce()
	}
	s := p.stats()
	if s.Syncs != 5 || s.Err != "" {
		t.Fatalf("stats after 5 syncs: %+v", s)
	}
	if s.P50 <= 0 || s.P50 > s.P99 || s.P99 > s.Max {
		t.Errorf("percentiles out of order: %+v", s)
	}
	p.start(time.Hour) // no tick during the test: only what it already had is cleared
	if s := p.finish(); s.Syncs != 0 || s.P99 != 0 {
		t.Errorf("a probe restarted kept earlier samples: %+v", s)
	}
}

// TestDiskProbePercentiles: p50, p99 and max come from the sorted samples.
func TestDiskProbePercentiles(t *testing.T) {
	p := &diskProbe{}
	for i := 100; i >= 1; i-- {
		p.samples = append(p.samples, probeSample{d: time.Duration(i) * time.Millisecond})
	}
	s := p.stats()
	if s.P50 != 51*time.Millisecond || s.P99 != 100*time.Millisecond || s.Max != 100*time.Millisecond {
		t.Errorf("stats of 1..100 ms: %+v", s)
	}
}

// TestDiskProbeLongestDuring: a window sees the syncs that overlapped it,
// including one that began before it and one still in progress.
func TestDiskProbeLongestDuring(t *testing.T) {
	t0 := time.Now().Add(-time.Hour)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	p := &diskProbe{samples: []probeSample{
		{at(0), 300 * time.Millisecond},  // ends at 300
		{at(350), 5 * time.Millisecond},  // ends at 355
		{at(400), 80 * time.Millisecond}, // ends at 480
		{at(500), 2 * time.Millisecond},
	}}
	for _, tc := range []struct {
		from, to int
		want     time.Duration
	}{
		{200, 360, 300 * time.Millisecond}, // the first began before the window
		{301, 360, 5 * time.Millisecond},
		{310, 450, 80 * time.Millisecond},
		{490, 600, 2 * time.Millisecond},
		{600, 700, 0},
	} {
		if got := p.longestDuring(at(tc.from), at(tc.to)); got != tc.want {
			t.Errorf("[%d, %d] ms: %v, want %v", tc.from, tc.to, got, tc.want)
		}
	}
	p.busy = time.Now().Add(-time.Second) // a sync stalled for a second so far
	if got := p.longestDuring(at(600), time.Now()); got < time.Second {
		t.Errorf("a sync in progress for 1 s: %v", got)
	}
}

// TestPrintRounds: every round of a target is printed with its own disk
// probe, delivered rates for stores and accepted rates for the sinks.
func TestPrintRounds(t *testing.T) {
	run := func(accepted, delivered float64, cpu time.Duration) loadgen.MixSummary {
		s := loadgen.MixSummary{}
		s.SMTP.MsgPerSec = accepted
		if delivered > 0 {
			s.Delivery.Measured, s.Delivery.MsgPerSec = true, delivered
		}
		s.CPU = map[string]loadgen.CPUSummary{"x": {Load: cpu}}
		return s
	}
	results := map[string][]loadgen.MixSummary{
		"quill": {run(5800, 5747.7, 9300*time.Millisecond), run(2800, 2755.7, 4100*time.Millisecond)},
		"sink":  {run(13335.6, 0, 8300*time.Millisecond)},
	}
	disk := map[string][]probeStats{
		"quill": {{Syncs: 10, P99: 300 * time.Microsecond, Max: time.Millisecond}, {Syncs: 10, P99: 120 * time.Millisecond, Max: 400 * time.Millisecond}},
	}
	var out bytes.Buffer
	if err := printRounds(&out, results, disk, false, 0.1); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"quill: 5747.7 on 9.3 CPU-s, probe p99 0.30 ms max 1.0 ms; 2755.7 on 4.1 CPU-s, probe p99 120.00 ms max 400.0 ms\n",
		"sink: 13335.6 on 8.3 CPU-s\n",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("no %q in\n%s", want, out.String())
		}
	}
}
