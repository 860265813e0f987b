package loadgen

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// Config describes an SMTP load run.
type Config struct {
	// Addr is the SMTP (or submission) listener, host:port.
	Addr string
	// Spec describes the messages; its From is also the envelope sender.
	Spec Spec
	// Concurrency is the number of connections open at once, each driven
	// by one goroutine that runs its transactions back to back.
	Concurrency int
	// MessagesPerConn is how many transactions a connection carries before
	// QUIT and a new connection: 1 is one message per connection
	// (Porcupine, postal), 0 keeps each connection for the whole run. The
	// setup (connect, greeting, EHLO) counts in the first message's
	// latency.
	MessagesPerConn int
	// Count stops the run after this many messages have been attempted;
	// 0 means no limit.
	Count int64
	// Duration stops starting new transactions after this long; those in
	// flight complete. 0 means no limit. Cancelling the context passed to
	// Run stops at once, failing transactions in flight.
	Duration time.Duration
	// Rate > 0 is open loop: message i is due at the start plus i/Rate,
	// its latency counts from then (a server that falls behind is charged
	// for the wait), and Concurrency bounds the messages in flight. 0 is
	// closed loop: each connection sends its next message at once.
	Rate float64
	// Timeout bounds every wait for a reply (and every write); default 60s.
	Timeout time.Duration
	// Helo is the EHLO name; default "quill-load.invalid".
	Helo string
	// Dialer opens connections; default a net.Dialer.
	Dialer Dialer
	// OnRecord, when set, is called once for every attempted message, from
	// the worker goroutine that sent it, after the outcome is known. It
	// must be safe for concurrent use and should be quick: the worker's
	// connection waits for it. The Record is the callee's to keep.
	OnRecord func(*Record)
	// Logger receives connection-level failures; default discards.
	Logger *slog.Logger
}

// Record is what the client knows about one attempted message: enough to
// verify the server's store afterwards.
type Record struct {
	ID    string
	Seq   uint64
	Rcpts []string // the message's recipients, in RCPT order
	// Accepted[i] reports whether the server accepted Rcpts[i] (2xx to
	// RCPT). An Acked message must be stored for exactly those recipients.
	Accepted []bool
	Sum      [sha256.Size]byte
	Size     int
	Outcome  Outcome
	// Code is the final reply of an Acked message or the deciding reply of
	// a Rejected one; 0 for NoReply.
	Code int
	// Stage is how far the transaction got; for NoReply, where it failed.
	Stage   Stage
	Latency time.Duration
	Err     error // the transport failure of a NoReply message
}

// Ledger collects Records from concurrent workers; its Add is a valid
// Config.OnRecord.
type Ledger struct {
	mu struct {
		sync.Mutex
		records []*Record
	}
}

// Add appends r.
func (l *Ledger) Add(r *Record) {
	l.mu.Lock()
	l.mu.records = append(l.mu.records, r)
	l.mu.Unlock()
}

// Records returns a copy of the records added so far.
func (l *Ledger) Records() []*Record {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]*Record(nil), l.mu.records...)
}

// ErrAllWorkersFailed is returned when no worker could keep a connection.
var ErrAllWorkersFailed = errors.New("loadgen: every worker gave up connecting")

// maxDialFailures is how many consecutive failed connection attempts make a
// worker give up.
const maxDialFailures = 8

// Run delivers messages as cfg describes and returns the summary. It
// returns an error only when the run could not proceed (invalid config, or
// every worker failed to connect); per-message failures are in the summary
// and the records.
func Run(ctx context.Context, cfg Config) (Summary, error) {
	if cfg.Concurrency <= 0 {
		return Summary{}, fmt.Errorf("loadgen: concurrency %d", cfg.Concurrency)
	}
	if cfg.Rate < 0 {
		return Summary{}, fmt.Errorf("loadgen: rate %v", cfg.Rate)
	}
	if cfg.MessagesPerConn < 0 {
		return Summary{}, fmt.Errorf("loadgen: messages per connection %d", cfg.MessagesPerConn)
	}
	if err := cfg.Spec.Validate(); err != nil {
		return Summary{}, err
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = 60 * time.Second
	}
	if cfg.Helo == "" {
		cfg.Helo = "quill-load.invalid"
	}
	if cfg.Dialer == nil {
		cfg.Dialer = &net.Dialer{Timeout: cfg.Timeout}
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}

	start := time.Now()
	var stopAt time.Time
	if cfg.Duration > 0 {
		stopAt = start.Add(cfg.Duration)
	}
	var next atomic.Uint64
	// claim hands out the next message and the moment it is due.
	claim := func() (uint64, time.Time, bool) {
		now := time.Now()
		if ctx.Err() != nil || (!stopAt.IsZero() && !now.Before(stopAt)) {
			return 0, time.Time{}, false
		}
		seq := next.Add(1) - 1
		if cfg.Count > 0 && seq >= uint64(cfg.Count) {
			return 0, time.Time{}, false
		}
		if cfg.Rate == 0 {
			return seq, now, true
		}
		due := start.Add(time.Duration(float64(seq) / cfg.Rate * float64(time.Second)))
		if !stopAt.IsZero() && !due.Before(stopAt) {
			return 0, time.Time{}, false
		}
		return seq, due, true
	}

	stats := make([]*workerStats, cfg.Concurrency)
	gaveUp := make([]bool, cfg.Concurrency)
	var wg sync.WaitGroup
	for i := range stats {
		stats[i] = &workerStats{}
		gen, err := NewGenerator(cfg.Spec)
		if err != nil {
			return Summary{}, err
		}
		wg.Go(func() { gaveUp[i] = runWorker(ctx, &cfg, gen, claim, stats[i]) })
	}
	wg.Wait()

	sum := summarize(time.Since(start), stats)
	for _, g := range gaveUp {
		if !g {
			return sum, nil
		}
	}
	return sum, ErrAllWorkersFailed
}

// runWorker drives one connection until claim says stop or ctx ends, and
// reports whether it gave up because it could not connect.
func runWorker(ctx context.Context, cfg *Config, gen *Generator, claim func() (uint64, time.Time, bool), st *workerStats) bool {
	var c *smtpClient
	defer func() {
		if c != nil {
			c.quit()
		}
	}()
	dialFailures := 0
	for {
		seq, t0, ok := claim()
		if !ok || !waitUntil(ctx, t0) {
			return false
		}
		for c == nil {
			var err error
			c, err = dialSMTP(ctx, cfg.Dialer, cfg.Addr, cfg.Helo, cfg.Timeout)
			if err == nil {
				dialFailures = 0
				st.conns++
				break
			}
			if ctx.Err() != nil {
				return false
			}
			st.noteError("dial")
			dialFailures++
			cfg.Logger.Warn("loadgen: connect failed", "addr", cfg.Addr, "attempt", dialFailures, "err", err)
			if dialFailures == maxDialFailures {
				return true
			}
			if !backoff(ctx, dialFailures) {
				return false
			}
		}

		m := gen.Next(seq)
		res := c.send(m, cfg.Spec.From)
		lat := time.Since(t0)
		st.add(m, res, lat, ctx.Err() != nil)
		if cfg.OnRecord != nil {
			cfg.OnRecord(newRecord(m, res, lat))
		}
		if c.broken {
			if res.err != nil && ctx.Err() == nil {
				cfg.Logger.Warn("loadgen: connection failed", "addr", cfg.Addr, "err", res.err)
			}
			c.close()
			c = nil
			continue
		}
		if c.sent++; cfg.MessagesPerConn > 0 && c.sent >= cfg.MessagesPerConn {
			c.quit()
			c = nil
		}
	}
}

// waitUntil waits until t or until ctx ends; it reports whether t came.
func waitUntil(ctx context.Context, t time.Time) bool {
	d := time.Until(t)
	if d <= 0 {
		return ctx.Err() == nil
	}
	tm := time.NewTimer(d)
	defer tm.Stop()
	select {
	case <-tm.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// backoff waits 25ms doubling per failure up to 1s, or until ctx ends; it
// reports whether to try again.
func backoff(ctx context.Context, failures int) bool {
	return waitUntil(ctx, time.Now().Add(min(25*time.Millisecond<<min(failures-1, 6), time.Second)))
}

func newRecord(m *Message, res txResult, lat time.Duration) *Record {
	return &Record{
		ID:       m.ID(),
		Seq:      m.Seq,
		Rcpts:    append([]string(nil), m.Rcpts...),
		Accepted: append([]bool(nil), res.accepted...),
		Sum:      m.Sum(),
		Size:     len(m.Data),
		Outcome:  res.outcome,
		Code:     res.code,
		Stage:    res.stage,
		Latency:  lat,
		Err:      res.err,
	}
}
