package cluster

import (
	"runtime"
	"sync"
	"syscall"
	"time"
)

// Load is what a node reports of its own load.
type Load struct {
	// Sessions is the number of client connections open on the node's
	// protocol listeners (SMTP, submission, LMTP, POP3, IMAP).
	Sessions int
	// CPU is the process's CPU time (user and system) over the last
	// loadWindow, divided by that window and by the machine's CPUs: 0 is
	// idle, 1 every CPU busy.
	CPU float64
}

// Sampling: one getrusage call a second, the last loadWindow kept.
const (
	loadTick   = time.Second
	loadWindow = 5 * time.Second
)

type cpuSample struct {
	at  time.Time
	cpu time.Duration
}

// loadSampler measures the process's recent CPU use.
type loadSampler struct {
	sessions func() int

	mu      sync.Mutex
	samples []cpuSample // oldest first, spanning at most loadWindow

	done chan struct{}
	wg   sync.WaitGroup
	once sync.Once
}

func startLoadSampler(sessions func() int) *loadSampler {
	l := &loadSampler{sessions: sessions, done: make(chan struct{})}
	l.sample()
	l.wg.Add(1)
	go func() {
		defer l.wg.Done()
		tick := time.NewTicker(loadTick)
		defer tick.Stop()
		for {
			select {
			case <-l.done:
				return
			case <-tick.C:
				l.sample()
			}
		}
	}()
	return l
}

func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func (l *loadSampler) sample() {
	s := cpuSample{at: time.Now(), cpu: processCPU()}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.samples = append(l.samples, s)
	for len(l.samples) > 2 && s.at.Sub(l.samples[1].at) >= loadWindow {
		l.samples = l.samples[1:]
	}
}

// current returns the load now: the sessions as counted, the CPU over
// the samples kept (and up to this moment).
func (l *loadSampler) current() Load {
	var ld Load
	if l.sessions != nil {
		ld.Sessions = l.sessions()
	}
	now := cpuSample{at: time.Now(), cpu: processCPU()}
	l.mu.Lock()
	first := l.samples[0]
	l.mu.Unlock()
	if span := now.at.Sub(first.at); span > 0 {
		ld.CPU = float64(now.cpu-first.cpu) / float64(span) / float64(runtime.NumCPU())
	}
	return ld
}

func (l *loadSampler) stop() {
	l.once.Do(func() { close(l.done) })
	l.wg.Wait()
}
