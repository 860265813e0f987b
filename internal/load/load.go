// Package load measures the node's own load and says when the node is
// overloaded, so that it can refuse new work at once (SMTP 421, IMAP
// `* BYE [UNAVAILABLE]`, POP3 `-ERR [SYS/TEMP]`) instead of accepting it
// and letting every client time out (issue 35, item 8).
//
// The overload signal is the Go scheduler's latency: how long a goroutine
// that is ready to run waits before it runs (runtime/metrics
// /sched/latencies:seconds). It rises when the node has more work than CPU,
// whatever the work is (sessions, KDF evaluations, forwarded writes, the
// node's share of a machine it shares), and it is what every client of the
// node waits for on top of the work itself. The decision uses its 90th
// percentile over each sample (DefaultThreshold says why). CPU share alone cannot say
// that: a node at 100% CPU may still answer promptly.
//
// Decision, with hysteresis so that the state does not flap: overloaded
// after enterSamples consecutive samples whose p90 exceeds the threshold;
// normal again after leaveSamples consecutive samples at or below half of
// it. A sample in which too few goroutines were scheduled to give a p90
// counts as below (an idle scheduler is not overloaded).
package load

import (
	"log/slog"
	"math"
	"runtime"
	"runtime/metrics"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// DefaultThreshold is the scheduler latency (p90 over one sample) above
// which the node counts as overloaded when the configuration says nothing.
// A reply takes several waits to run; when one in ten waits half a second,
// replies take seconds and the clients' timeouts (and the cluster's
// forward timeout, 5 s) come next. The 90th percentile, not the 99th: a
// burst of goroutines woken at once (a node resumed after a stall) is a
// small share of a sample's schedulings, sustained saturation is not.
const DefaultThreshold = 500 * time.Millisecond

const (
	// DefaultInterval is the sampling period.
	DefaultInterval = 250 * time.Millisecond
	// cpuWindow is the span over which CPU use is reported.
	cpuWindow = 5 * time.Second
	// enterSamples above the threshold in a row make the node
	// overloaded; leaveSamples at or below half of it end that.
	enterSamples = 2
	leaveSamples = 4
	// minScheduled is the fewest schedulings counted in a sample that give
	// a p90. The runtime counts one goroutine transition in eight; a node
	// saturated by a few CPU-bound goroutines (KDF evaluations, say) is
	// preempted only every 10 ms per CPU, so the bound is low and the
	// hysteresis absorbs the noise.
	minScheduled = 10
	schedMetric  = "/sched/latencies:seconds"
)

// Load is what the node reports of its own load.
type Load struct {
	// Sessions is the number of client connections open on the node's
	// protocol listeners.
	Sessions int
	// CPU is the process's CPU time (user and system) over the last few
	// seconds, divided by that span and by the machine's CPUs: 0 is idle,
	// 1 every CPU busy.
	CPU float64
	// SchedP90 is the scheduler latency's 90th percentile over the last
	// sample (0 when too little was scheduled to tell).
	SchedP90 time.Duration
	// Overloaded: the node refuses new connections.
	Overloaded bool
}

// Options configure a Monitor.
type Options struct {
	// Threshold is the scheduler latency (p90 over one sample) above
	// which the node is overloaded. Zero means DefaultThreshold; a
	// negative value turns shedding off (load is still measured).
	Threshold time.Duration
	// Interval is the sampling period; zero means DefaultInterval.
	Interval time.Duration
	// Sessions, if set, counts the open client connections.
	Sessions func() int
	// Logger receives the transitions into and out of overload.
	Logger *slog.Logger
	// Registerer, if set, receives the monitor's metrics.
	Registerer prometheus.Registerer
}

type cpuSample struct {
	at  time.Time
	cpu time.Duration
}

// Monitor samples the node's load. Its methods are safe for concurrent
// use; a nil Monitor is never overloaded and reports no load.
type Monitor struct {
	threshold time.Duration
	sessions  func() int
	log       *slog.Logger

	overloaded atomic.Bool
	p90        atomic.Int64 // nanoseconds

	// Guarded by mu: the CPU samples (oldest first, spanning at most
	// cpuWindow), the previous scheduler histogram and the run lengths
	// of the hysteresis.
	mu        sync.Mutex
	cpu       []cpuSample
	sample    []metrics.Sample
	prev      []uint64
	above     int
	below     int
	episodes  prometheus.Counter
	state     prometheus.Gauge
	latencies prometheus.Gauge

	done chan struct{}
	wg   sync.WaitGroup
	once sync.Once
}

// Start begins sampling every opts.Interval until Stop.
func Start(opts Options) (*Monitor, error) {
	m := &Monitor{threshold: opts.Threshold, sessions: opts.Sessions, log: opts.Logger, done: make(chan struct{}),
		sample: []metrics.Sample{{Name: schedMetric}}}
	if m.threshold == 0 {
		m.threshold = DefaultThreshold
	}
	if m.log == nil {
		m.log = slog.Default()
	}
	interval := opts.Interval
	if interval <= 0 {
		interval = DefaultInterval
	}
	m.episodes = prometheus.NewCounter(prometheus.CounterOpts{Name: "quill_overload_episodes_total",
		Help: "Times the node became overloaded (scheduler latency above the threshold) and began refusing new connections."})
	m.state = prometheus.NewGauge(prometheus.GaugeOpts{Name: "quill_overloaded",
		Help: "1 while the node is overloaded and refuses new connections, else 0."})
	m.latencies = prometheus.NewGauge(prometheus.GaugeOpts{Name: "quill_sched_latency_p90_seconds",
		Help: "90th percentile of the Go scheduler latency (time a runnable goroutine waited to run) over the last sample."})
	if opts.Registerer != nil {
		for _, c := range []prometheus.Collector{m.episodes, m.state, m.latencies} {
			if err := opts.Registerer.Register(c); err != nil {
				return nil, err
			}
		}
	}
	m.tick()
	m.wg.Add(1)
	go func() {
		defer m.wg.Done()
		t := time.NewTicker(interval)
		defer t.Stop()
		for {
			select {
			case <-m.done:
				return
			case <-t.C:
				m.tick()
			}
		}
	}()
	return m, nil
}

// Stop ends sampling; it waits for the sampler to exit.
func (m *Monitor) Stop() {
	if m == nil {
		return
	}
	m.once.Do(func() { close(m.done) })
	m.wg.Wait()
}

// Overloaded reports whether the node is overloaded now.
func (m *Monitor) Overloaded() bool { return m != nil && m.overloaded.Load() }

// Current returns the load now: sessions as counted, CPU over the samples
// kept and up to this moment, the last sample's scheduler latency.
func (m *Monitor) Current() Load {
	if m == nil {
		return Load{}
	}
	var ld Load
	if m.sessions != nil {
		ld.Sessions = m.sessions()
	}
	now := cpuSample{at: time.Now(), cpu: processCPU()}
	m.mu.Lock()
	first := m.cpu[0]
	m.mu.Unlock()
	if span := now.at.Sub(first.at); span > 0 {
		ld.CPU = float64(now.cpu-first.cpu) / float64(span) / float64(runtime.NumCPU())
	}
	ld.SchedP90 = time.Duration(m.p90.Load())
	ld.Overloaded = m.overloaded.Load()
	return ld
}

func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// tick takes one sample: CPU, and the scheduler latency histogram's
// change since the last sample, which drives the overload state.
func (m *Monitor) tick() {
	s := cpuSample{at: time.Now(), cpu: processCPU()}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.cpu = append(m.cpu, s)
	for len(m.cpu) > 2 && s.at.Sub(m.cpu[1].at) >= cpuWindow {
		m.cpu = m.cpu[1:]
	}

	metrics.Read(m.sample)
	if m.sample[0].Value.Kind() != metrics.KindFloat64Histogram {
		return // not measured by this runtime: never overloaded
	}
	h := m.sample[0].Value.Float64Histogram()
	first := m.prev == nil
	delta := make([]uint64, len(h.Counts))
	for i, c := range h.Counts {
		if !first {
			delta[i] = c - m.prev[i]
		}
	}
	m.prev = append(m.prev[:0], h.Counts...)
	if first {
		return
	}
	p90 := percentile(delta, h.Buckets, 0.9)
	m.p90.Store(int64(p90))
	m.latencies.Set(p90.Seconds())
	m.decide(p90)
}

// decide applies the hysteresis to one sample's p90.
func (m *Monitor) decide(p90 time.Duration) {
	if m.threshold < 0 {
		return
	}
	switch {
	case p90 > m.threshold:
		m.above, m.below = m.above+1, 0
	case p90 <= m.threshold/2:
		m.above, m.below = 0, m.below+1
	default:
		m.above, m.below = 0, 0
	}
	if !m.overloaded.Load() && m.above >= enterSamples {
		m.overloaded.Store(true)
		m.state.Set(1)
		m.episodes.Inc()
		m.log.Warn("overloaded: refusing new connections until the scheduler catches up",
			"sched_latency_p90", p90, "threshold", m.threshold)
	} else if m.overloaded.Load() && m.below >= leaveSamples {
		m.overloaded.Store(false)
		m.state.Set(0)
		m.log.Info("no longer overloaded: accepting connections again", "sched_latency_p90", p90)
	}
}

// percentile returns the upper bound of the bucket holding quantile q of
// counts (buckets[i], buckets[i+1] bound counts[i]); 0 when fewer than
// minScheduled were counted.
func percentile(counts []uint64, buckets []float64, q float64) time.Duration {
	var total uint64
	for _, c := range counts {
		total += c
	}
	if total < minScheduled {
		return 0
	}
	rank := uint64(math.Ceil(q * float64(total)))
	var cum uint64
	for i, c := range counts {
		cum += c
		if cum >= rank {
			hi := buckets[i+1]
			if math.IsInf(hi, 1) {
				hi = buckets[i]
			}
			return time.Duration(hi * float64(time.Second))
		}
	}
	return 0
}
