package load

import (
	"context"
	"io"
	"log/slog"
	"math"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

func quiet() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// waitFor polls cond until it holds or the deadline passes.
func waitFor(t *testing.T, what string, d time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %v", what, d)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestOverloadFromRealSchedulerLatency runs more busy goroutines than the
// process has CPUs, which makes runnable goroutines wait for each other's
// time slices (about 10 ms each): the monitor must see the latency, turn
// overloaded, and turn back once the spinners stop.
func TestOverloadFromRealSchedulerLatency(t *testing.T) {
	reg := prometheus.NewRegistry()
	m, err := Start(Options{Threshold: 5 * time.Millisecond, Interval: 100 * time.Millisecond,
		Sessions: func() int { return 3 }, Logger: quiet(), Registerer: reg})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Stop()
	if m.Overloaded() {
		t.Fatal("overloaded before any load")
	}

	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for range 8 * runtime.GOMAXPROCS(0) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				// Spin, with a scheduling point now and then so that each
				// pass is counted by the latency histogram.
				for i := 0; i < 1e6; i++ {
					_ = math.Sqrt(float64(i))
				}
				runtime.Gosched()
			}
		}()
	}
	waitFor(t, "overloaded under spinning goroutines", 20*time.Second, m.Overloaded)
	ld := m.Current()
	if !ld.Overloaded || ld.SchedP90 <= 5*time.Millisecond || ld.Sessions != 3 || ld.CPU <= 0 {
		t.Errorf("load while spinning = %+v, want overloaded, p90 above 5ms, 3 sessions, CPU above 0", ld)
	}
	if got := testutil.ToFloat64(m.state); got != 1 {
		t.Errorf("quill_overloaded = %v while overloaded", got)
	}
	cancel()
	wg.Wait()
	waitFor(t, "back to normal after the spinners stop", 20*time.Second, func() bool { return !m.Overloaded() })
	if got := testutil.ToFloat64(m.episodes); got < 1 {
		t.Errorf("quill_overload_episodes_total = %v, want at least 1", got)
	}
	if got := testutil.ToFloat64(m.state); got != 0 {
		t.Errorf("quill_overloaded = %v after recovery", got)
	}
}

// TestHysteresis: one sample above the threshold is not overload; two in a
// row are; leaving takes four in a row at or below half the threshold, and
// a sample between half and the threshold resets both runs.
func TestHysteresis(t *testing.T) {
	m := &Monitor{threshold: 100 * time.Millisecond, log: quiet(),
		episodes: prometheus.NewCounter(prometheus.CounterOpts{Name: "e"}), state: prometheus.NewGauge(prometheus.GaugeOpts{Name: "s"})}
	steps := []struct {
		p90  time.Duration
		want bool
	}{
		{200 * time.Millisecond, false},
		{10 * time.Millisecond, false},
		{200 * time.Millisecond, false},
		{200 * time.Millisecond, true},
		{10 * time.Millisecond, true},
		{10 * time.Millisecond, true},
		{10 * time.Millisecond, true},
		{80 * time.Millisecond, true}, // between half and the threshold: the run restarts
		{10 * time.Millisecond, true},
		{10 * time.Millisecond, true},
		{10 * time.Millisecond, true},
		{0, false},
	}
	for i, s := range steps {
		m.decide(s.p90)
		if got := m.Overloaded(); got != s.want {
			t.Fatalf("step %d (p90 %v): overloaded = %v, want %v", i, s.p90, got, s.want)
		}
	}
	off := &Monitor{threshold: -1, log: quiet()}
	for range 10 {
		off.decide(time.Hour)
	}
	if off.Overloaded() {
		t.Error("a negative threshold must turn shedding off")
	}
	var none *Monitor
	if none.Overloaded() || none.Current() != (Load{}) {
		t.Error("a nil Monitor must report nothing")
	}
}

func TestPercentile(t *testing.T) {
	buckets := []float64{0, 0.001, 0.01, 0.1, math.Inf(1)}
	cases := []struct {
		counts []uint64
		want   time.Duration
	}{
		{[]uint64{9, 0, 0, 0}, 0},                          // too few to tell
		{[]uint64{100, 0, 0, 0}, time.Millisecond},         // all under 1 ms
		{[]uint64{98, 1, 1, 0}, 10 * time.Millisecond},     // rank 99 falls in the second bucket
		{[]uint64{90, 5, 4, 1}, 100 * time.Millisecond},    // the 99th is in (10ms, 100ms]
		{[]uint64{0, 0, 0, 100}, 100 * time.Millisecond},   // +Inf bucket: its lower bound
		{[]uint64{50, 0, 0, 50}, 100 * time.Millisecond},   // half beyond 100 ms
		{[]uint64{1000, 0, 10, 0}, time.Millisecond},       // under 1% in the tail
		{[]uint64{1000, 0, 20, 0}, 100 * time.Millisecond}, // 2% in (10ms, 100ms]
	}
	for _, c := range cases {
		if got := percentile(c.counts, buckets, 0.99); got != c.want {
			t.Errorf("percentile(%v) = %v, want %v", c.counts, got, c.want)
		}
	}
}
