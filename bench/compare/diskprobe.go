package main

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"syscall"
	"time"
)

// diskProbe measures the disk beside a run: every interval it overwrites
// one preallocated 4 KiB block of its own file and fdatasyncs it. An
// overwrite in place needs no journal commit, so each sample is the time
// the device takes to make 4 KiB durable, which every durable target waits
// for before acknowledging. A round whose probe saw syncs of tens of
// milliseconds measured the machine's disk, not the server: on shared
// hosts such rounds came with the durable servers using a third of their
// usual CPU ("What the mix costs before any storage" in
// docs/adr/0019-performance-record.md). At 20 syncs a second the probe adds next to
// nothing to the servers' thousand or more.
type diskProbe struct {
	f     *os.File
	block []byte
	stop  chan struct{}
	done  chan struct{}

	mu      sync.Mutex
	samples []probeSample
	busy    time.Time // when the sync in progress began; zero between syncs
	err     error
}

// probeSample is one write and fdatasync: when it began and how long it took.
type probeSample struct {
	at time.Time
	d  time.Duration
}

// probeStats summarises one probe.
type probeStats struct {
	Syncs int           `json:"syncs"`
	P50   time.Duration `json:"p50_ns"`
	P99   time.Duration `json:"p99_ns"`
	Max   time.Duration `json:"max_ns"`
	Err   string        `json:"error,omitempty"`
}

func (s probeStats) String() string {
	if s.Err != "" {
		return "disk probe failed: " + s.Err
	}
	return fmt.Sprintf("disk probe: %d fdatasyncs of 4 KiB, p50 %.2f ms, p99 %.2f ms, max %.1f ms",
		s.Syncs, ms(s.P50), ms(s.P99), ms(s.Max))
}

// newDiskProbe creates the probe's file in dir and makes its block durable
// once, so that later syncs overwrite allocated space.
func newDiskProbe(dir string) (*diskProbe, error) {
	f, err := os.OpenFile(filepath.Join(dir, "disk-probe"), os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return nil, err
	}
	p := &diskProbe{f: f, block: make([]byte, 4096)}
	_, err = f.WriteAt(p.block, 0)
	if err == nil {
		err = f.Sync()
	}
	if err != nil {
		f.Close()
		return nil, err
	}
	return p, nil
}

// syncOnce overwrites the block, fdatasyncs it and records how long that took.
func (p *diskProbe) syncOnce() {
	start := time.Now()
	p.mu.Lock()
	p.busy = start
	p.mu.Unlock()
	p.block[0]++
	_, err := p.f.WriteAt(p.block, 0)
	if err == nil {
		err = syscall.Fdatasync(int(p.f.Fd()))
	}
	d := time.Since(start)
	p.mu.Lock()
	defer p.mu.Unlock()
	p.busy = time.Time{}
	if err != nil {
		if p.err == nil {
			p.err = err
		}
		return
	}
	p.samples = append(p.samples, probeSample{start, d})
}

// longestDuring returns the longest sync that overlapped [start, end],
// counting one still in progress for as long as it has taken so far: a
// stall that began in the window may outlast it.
func (p *diskProbe) longestDuring(start, end time.Time) time.Duration {
	p.mu.Lock()
	defer p.mu.Unlock()
	var longest time.Duration
	if !p.busy.IsZero() && p.busy.Before(end) {
		longest = time.Since(p.busy)
	}
	// The syncs run one after another: walking back from the latest, the
	// first that ended before start ends the search.
	for i := len(p.samples) - 1; i >= 0; i-- {
		s := p.samples[i]
		if s.at.Add(s.d).Before(start) {
			break
		}
		if s.at.Before(end) && s.at.Add(s.d).After(start) {
			longest = max(longest, s.d)
		}
	}
	return longest
}

// start samples every interval until finish.
func (p *diskProbe) start(interval time.Duration) {
	p.stop, p.done = make(chan struct{}), make(chan struct{})
	p.samples, p.err = p.samples[:0], nil
	go func() {
		defer close(p.done)
		t := time.NewTicker(interval)
		defer t.Stop()
		for {
			select {
			case <-p.stop:
				return
			case <-t.C:
				p.syncOnce()
			}
		}
	}()
}

// finish stops the sampling that start began and summarises it.
func (p *diskProbe) finish() probeStats {
	close(p.stop)
	<-p.done
	return p.stats()
}

func (p *diskProbe) stats() probeStats {
	p.mu.Lock()
	defer p.mu.Unlock()
	var s probeStats
	if p.err != nil {
		s.Err = p.err.Error()
	}
	s.Syncs = len(p.samples)
	if s.Syncs == 0 {
		return s
	}
	v := make([]time.Duration, len(p.samples))
	for i, x := range p.samples {
		v[i] = x.d
	}
	slices.Sort(v)
	at := func(q float64) time.Duration { return v[min(len(v)-1, int(q*float64(len(v))))] }
	s.P50, s.P99, s.Max = at(0.50), at(0.99), v[len(v)-1]
	return s
}

func (p *diskProbe) close() error { return p.f.Close() }
