package loadgen

import (
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// The Porcupine mix: SMTP deliveries and retrieval sessions (POP3, or
// IMAP with Retrieval "imap") interleaved on the same clients, and the
// figures that tell a server that delivers from one that only queues.
//
// Outline of RunMix:
//
//	workers (Clients of them) claim transaction numbers i = 0, 1, ...;
//	  Mix.Kind(i) says SMTP or POP3; open loop waits for start + i/Rate;
//	  SMTP: one transaction on the worker's connection, which is closed
//	    (QUIT) after MessagesPerConn transactions (1: connect, EHLO, MAIL,
//	    RCPT, DATA, QUIT for every message, as Porcupine and postal do);
//	  POP3: one retrieval session for a user drawn from POP3Users:
//	    POP3 (USER, PASS, STAT, RETR all, DELE all, QUIT) or IMAP
//	    (LOGIN, SELECT, FETCH, STORE \Deleted, EXPUNGE, LOGOUT; see
//	    imapSession), never two at once for one user in IMAP mode.
//	one prober sends a message to a probe mailbox and logs in until it
//	  is visible: the end-to-end latency, one sample at a time.
//	after Duration: workers finish the transaction in flight; then the
//	  sampled mailboxes are drained round after round until everything
//	  acknowledged to them has been seen (or DrainTimeout).
//
// Delivered msg/s is acked/s times the share of the sampled mailboxes'
// acknowledged messages visible when the load stopped (retrieved by the
// mix, or found by the first drain round). A server that acknowledges and
// queues shows a low share; the drain time says how far behind it was.

// TxKind is the kind of one transaction of the mix.
type TxKind uint8

const (
	TxSMTP TxKind = iota // one mail transaction
	TxPOP3               // one retrieval session that empties a mailbox
)

// Mix spreads retrieval sessions evenly among SMTP transactions: of any
// 1,000 consecutive transactions exactly POP3PerMille are retrievals (POP3
// or IMAP, as MixConfig.Retrieval says), and they never bunch up
// (transaction i is one when floor((i+1)p) > floor(ip)).
type Mix struct {
	POP3PerMille uint64 // 0..1000
}

// Kind returns the kind of transaction i.
func (m Mix) Kind(i uint64) TxKind {
	p := min(m.POP3PerMille, 1000)
	// floor((1000q+r)p/1000) = qp + floor(rp/1000): only i mod 1000
	// matters, and (i+1)p cannot overflow.
	r := i % 1000
	if ((r+1)*p)/1000 > (r*p)/1000 {
		return TxPOP3
	}
	return TxSMTP
}

// MixConfig describes a run of the mix.
type MixConfig struct {
	SMTPAddr string
	// Retrieval is the protocol of the retrieval sessions, the prober and
	// the drain: RetrievalPOP3 (the default when empty) or RetrievalIMAP.
	Retrieval string
	// POP3Addr is the plaintext POP3 listener; needed when POP3 sessions,
	// Probes or Sample are retrieved with POP3.
	POP3Addr string
	// IMAPAddr is the plaintext IMAP listener (it must allow LOGIN, as a
	// loopback one does); needed in their place with RetrievalIMAP.
	IMAPAddr string
	// Spec describes the delivered messages; Spec.Rcpts is the recipient
	// distribution over the population.
	Spec Spec
	// POP3Users chooses the user of each POP3 session; nil: Spec.Rcpts.
	POP3Users RecipientPicker
	// Password is every user's (and every probe's) password.
	Password string
	Mix      Mix
	// Clients is the number of concurrent clients, each with its own SMTP
	// connection (POP3 sessions open their own).
	Clients int
	// MessagesPerConn is how many transactions a client sends on one SMTP
	// connection before it says QUIT and connects again for the next: 1 is
	// one message per connection (Porcupine, postal), 0 keeps the
	// connection for the whole run. The connection's setup (connect,
	// greeting, EHLO) is part of the latency of its first transaction.
	MessagesPerConn int
	// Rate > 0 is open loop: transaction i is due at start + i/Rate, and
	// its latency counts from then, so a server that falls behind is
	// charged for the wait (no coordinated omission). Clients bounds the
	// transactions in flight. Rate = 0 is closed loop.
	Rate     float64
	Duration time.Duration
	// Probes are mailboxes outside the population, reserved for the
	// end-to-end latency prober; empty disables it.
	Probes []string
	// Sample are the population mailboxes whose deliveries are tracked
	// (see SampleMailboxes); empty leaves delivery unmeasured.
	Sample []string
	// DrainTimeout bounds the drain of Sample after the load; default 60s.
	DrainTimeout time.Duration
	// LatencyBound: SMTP transactions slower than this (and failed ones)
	// are counted in SMTP.OverBound, for Saturate; 0 counts only failures.
	LatencyBound time.Duration
	// Processes name server process trees (root PIDs) whose CPU time is
	// measured from /proc.
	Processes map[string]int
	Timeout   time.Duration // every reply; default 60s
	Helo      string        // default "quill-load.invalid"
	Dialer    Dialer        // default a net.Dialer
	Logger    *slog.Logger  // default discards
}

// Retrieval protocols (MixConfig.Retrieval).
const (
	RetrievalPOP3 = "pop3"
	RetrievalIMAP = "imap"
)

// SampleMailboxes returns the mailboxes to track for delivered rate: the n/2
// most popular ranks of a Zipf population (they carry a large share of the
// mail, so the sample is big) and n - n/2 others spread evenly over the
// rest (so cold mailboxes are not ignored).
func SampleMailboxes(users []string, n int) []string {
	n = min(n, len(users))
	hot := n / 2
	out := append([]string(nil), users[:hot]...)
	rest, cold := len(users)-hot, n-hot
	for k := 0; k < cold; k++ {
		out = append(out, users[hot+k*rest/cold])
	}
	return out
}

func (c *MixConfig) validate() error {
	switch {
	case c.Clients <= 0:
		return fmt.Errorf("loadgen: mix clients %d", c.Clients)
	case c.Duration <= 0:
		return fmt.Errorf("loadgen: mix needs a duration")
	case c.Rate < 0:
		return fmt.Errorf("loadgen: negative rate")
	case c.MessagesPerConn < 0:
		return fmt.Errorf("loadgen: negative messages per connection")
	case c.Mix.POP3PerMille > 1000:
		return fmt.Errorf("loadgen: POP3 share above 1000 per mille")
	case c.Retrieval != "" && c.Retrieval != RetrievalPOP3 && c.Retrieval != RetrievalIMAP:
		return fmt.Errorf("loadgen: retrieval %q: want %q or %q", c.Retrieval, RetrievalPOP3, RetrievalIMAP)
	case c.Retrieval == RetrievalIMAP && c.IMAPAddr == "" && c.retrieves():
		return fmt.Errorf("loadgen: IMAP sessions, probes and the delivery sample need IMAPAddr")
	case c.Retrieval != RetrievalIMAP && c.POP3Addr == "" && c.retrieves():
		return fmt.Errorf("loadgen: POP3 sessions, probes and the delivery sample need POP3Addr")
	case c.SMTPAddr == "" && c.Mix.POP3PerMille < 1000:
		return fmt.Errorf("loadgen: no SMTP address")
	}
	return c.Spec.Validate()
}

// retrieves reports whether the run has retrieval sessions, a prober or a
// drain.
func (c *MixConfig) retrieves() bool {
	return c.Mix.POP3PerMille > 0 || len(c.Probes) > 0 || len(c.Sample) > 0
}

func (c *MixConfig) setDefaults() {
	if c.Retrieval == "" {
		c.Retrieval = RetrievalPOP3
	}
	if c.Timeout <= 0 {
		c.Timeout = 60 * time.Second
	}
	if c.DrainTimeout <= 0 {
		c.DrainTimeout = 60 * time.Second
	}
	if c.Helo == "" {
		c.Helo = "quill-load.invalid"
	}
	if c.Dialer == nil {
		c.Dialer = &net.Dialer{Timeout: c.Timeout}
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.POP3Users == nil {
		c.POP3Users = c.Spec.Rcpts
	}
}

// mixRun is the state shared by the workers of one RunMix.
type mixRun struct {
	cfg     *MixConfig
	ctx     context.Context
	start   time.Time
	stopAt  time.Time
	next    atomic.Uint64
	idPfx   string // RunID + "."
	sample  map[string]int
	acked   []atomic.Int64 // per sampled mailbox: acknowledged deliveries
	fetched []atomic.Int64 // per sampled mailbox: this run's messages retrieved and deleted

	// busy holds, in IMAP mode, the users (lower case) with a retrieval
	// session in flight: IMAP has no [IN-USE], and two sessions on one
	// mailbox would retrieve and count the same messages.
	busy struct {
		sync.Mutex
		users map[string]struct{}
	}
}

// retrieve runs one retrieval session for user with the run's protocol;
// the mix's workers, the prober and the drain all come through here. In
// IMAP mode a user whose session is in flight gets errInUse without a
// session, as a POP3 server answers [IN-USE].
func (r *mixRun) retrieve(user, wantID string) pop3Result {
	if r.cfg.Retrieval != RetrievalIMAP {
		return pop3Session(r.ctx, r.cfg, user, r.idPfx, wantID)
	}
	key := strings.ToLower(user)
	r.busy.Lock()
	if _, ok := r.busy.users[key]; ok {
		r.busy.Unlock()
		return pop3Result{err: fmt.Errorf("imap: %w", errInUse)}
	}
	if r.busy.users == nil {
		r.busy.users = make(map[string]struct{})
	}
	r.busy.users[key] = struct{}{}
	r.busy.Unlock()
	defer func() {
		r.busy.Lock()
		delete(r.busy.users, key)
		r.busy.Unlock()
	}()
	return imapSession(r.ctx, r.cfg, user, r.idPfx, wantID)
}

// claim returns the next transaction and when it is due (the zero time in
// closed loop), or false when the run is over.
func (r *mixRun) claim() (uint64, time.Time, bool) {
	if r.ctx.Err() != nil || !time.Now().Before(r.stopAt) {
		return 0, time.Time{}, false
	}
	i := r.next.Add(1) - 1
	if r.cfg.Rate == 0 {
		return i, time.Time{}, true
	}
	due := r.start.Add(time.Duration(float64(i) / r.cfg.Rate * float64(time.Second)))
	if !due.Before(r.stopAt) {
		return 0, time.Time{}, false
	}
	return i, due, true
}

// RunMix runs the mix as cfg describes, then drains the sample, and
// returns the summary. It fails only when the run cannot proceed.
func RunMix(ctx context.Context, cfg MixConfig) (MixSummary, error) {
	if err := cfg.validate(); err != nil {
		return MixSummary{}, err
	}
	cfg.setDefaults()
	r := &mixRun{cfg: &cfg, ctx: ctx, idPfx: cfg.Spec.RunID + ".", sample: make(map[string]int, len(cfg.Sample))}
	for i, mb := range cfg.Sample {
		r.sample[strings.ToLower(mb)] = i
	}
	r.acked = make([]atomic.Int64, len(cfg.Sample))
	r.fetched = make([]atomic.Int64, len(cfg.Sample))

	cpu0, err := snapshotCPU(cfg.Processes)
	if err != nil {
		return MixSummary{}, err
	}
	m0 := snapshotMachine()
	r.start = time.Now()
	r.stopAt = r.start.Add(cfg.Duration)

	stats := make([]*mixWorker, cfg.Clients)
	var wg sync.WaitGroup
	for i := range stats {
		gen, err := NewGenerator(cfg.Spec)
		if err != nil {
			return MixSummary{}, err
		}
		w := &mixWorker{run: r, gen: gen}
		w.rng = rand.New(&w.pcg)
		stats[i] = w
		wg.Go(w.loop)
	}
	var pr *prober
	proberDone := make(chan struct{})
	if len(cfg.Probes) > 0 {
		pr = newProber(r)
		go func() {
			defer close(proberDone)
			pr.loop()
		}()
	} else {
		close(proberDone)
	}
	wg.Wait()
	<-proberDone
	elapsed := time.Since(r.start)
	cpu1, err := snapshotCPU(cfg.Processes)
	if err != nil {
		return MixSummary{}, err
	}
	m1 := snapshotMachine()

	drain := r.drain()
	cpu2, err := snapshotCPU(cfg.Processes)
	if err != nil {
		return MixSummary{}, err
	}
	return r.summarize(elapsed, stats, pr, drain, cpu0, cpu1, cpu2, m0, m1), nil
}

// mixWorker is one client: an SMTP connection (kept for
// MixConfig.MessagesPerConn transactions) and its own generator, random
// source and statistics.
type mixWorker struct {
	run  *mixRun
	gen  *Generator
	pcg  rand.PCG
	rng  *rand.Rand
	smtp *smtpClient

	st      workerStats // SMTP
	pop     pop3Stats
	timer   *time.Timer
	rcptBuf []string
	overBnd int64
}

func (w *mixWorker) loop() {
	defer func() {
		if w.smtp != nil {
			w.smtp.quit()
		}
	}()
	cfg := w.run.cfg
	for {
		i, due, ok := w.run.claim()
		if !ok {
			return
		}
		if !due.IsZero() && !w.wait(due) {
			return
		}
		t0 := due
		if t0.IsZero() {
			t0 = time.Now()
		}
		switch cfg.Mix.Kind(i) {
		case TxSMTP:
			w.smtpTx(i, t0)
		case TxPOP3:
			w.pcg.Seed(cfg.Spec.Seed^0x9e3779b97f4a7c15, i)
			w.rcptBuf = cfg.POP3Users.Pick(w.rng, w.rcptBuf[:0])
			res := w.run.retrieve(w.rcptBuf[0], "")
			w.pop.add(res, time.Since(t0))
			if idx, ok := w.run.sample[strings.ToLower(w.rcptBuf[0])]; ok && res.err == nil {
				w.run.fetched[idx].Add(res.runMsgs)
			}
		}
	}
}

// wait sleeps until due; false when the run's context ended first.
func (w *mixWorker) wait(due time.Time) bool {
	d := time.Until(due)
	if d <= 0 {
		return true
	}
	if w.timer == nil {
		w.timer = time.NewTimer(d)
	} else {
		w.timer.Reset(d)
	}
	select {
	case <-w.timer.C:
		return true
	case <-w.run.ctx.Done():
		return false
	}
}

func (w *mixWorker) smtpTx(i uint64, t0 time.Time) {
	cfg, ctx := w.run.cfg, w.run.ctx
	if w.smtp == nil {
		c, err := dialSMTP(ctx, cfg.Dialer, cfg.SMTPAddr, cfg.Helo, cfg.Timeout)
		if err != nil {
			w.st.attempted++
			w.st.noReply++
			w.st.noteError("dial")
			w.overBnd++
			cfg.Logger.Warn("loadgen: connect failed", "addr", cfg.SMTPAddr, "err", err)
			if ctx.Err() == nil {
				backoff(ctx, 1)
			}
			return
		}
		w.smtp = c
		w.st.conns++
	}
	m := w.gen.Next(i)
	res := w.smtp.send(m, cfg.Spec.From)
	lat := time.Since(t0)
	w.st.add(m, res, lat, ctx.Err() != nil)
	if res.outcome != Acked || (cfg.LatencyBound > 0 && lat > cfg.LatencyBound) {
		w.overBnd++
	}
	if res.outcome == Acked && len(w.run.sample) > 0 {
		for k, rc := range m.Rcpts {
			if !res.accepted[k] {
				continue
			}
			if idx, ok := w.run.sample[strings.ToLower(rc)]; ok {
				w.run.acked[idx].Add(1)
			}
		}
	}
	if w.smtp.broken {
		if res.err != nil && ctx.Err() == nil {
			cfg.Logger.Warn("loadgen: connection failed", "addr", cfg.SMTPAddr, "err", res.err)
		}
		w.smtp.close()
		w.smtp = nil
		return
	}
	if w.smtp.sent++; cfg.MessagesPerConn > 0 && w.smtp.sent >= cfg.MessagesPerConn {
		w.smtp.quit()
		w.smtp = nil
	}
}

// drainResult is what the drain of the sample found.
type drainResult struct {
	sampleAcked   int64 // acknowledged deliveries to sampled mailboxes
	fetchedInRun  int64 // of those, retrieved by the mix's retrieval sessions
	firstRound    int64 // found by the first drain round
	found         int64 // found by all drain rounds
	rounds        int
	elapsed       time.Duration
	complete      bool
	sessionErrors int64
}

// drain empties the sampled mailboxes round after round until every
// acknowledged delivery to them has been retrieved, or DrainTimeout.
func (r *mixRun) drain() drainResult {
	var d drainResult
	n := len(r.cfg.Sample)
	if n == 0 {
		return d
	}
	want := make([]int64, n)
	have := make([]int64, n)
	for i := range want {
		want[i] = r.acked[i].Load()
		have[i] = r.fetched[i].Load()
		d.sampleAcked += want[i]
		d.fetchedInRun += have[i]
	}
	start := time.Now()
	deadline := start.Add(r.cfg.DrainTimeout)
	pace := time.NewTicker(100 * time.Millisecond) // paces rounds; it synchronises nothing
	defer pace.Stop()
	for {
		done := true
		for i, mb := range r.cfg.Sample {
			if have[i] >= want[i] {
				continue
			}
			res := r.retrieve(mb, "")
			if res.err != nil {
				d.sessionErrors++
				done = false
				continue
			}
			have[i] += res.runMsgs
			d.found += res.runMsgs
			if d.rounds == 0 {
				d.firstRound += res.runMsgs
			}
			if have[i] < want[i] {
				done = false
			}
		}
		d.rounds++
		if done {
			d.complete = true
			break
		}
		if r.ctx.Err() != nil || time.Now().After(deadline) {
			break
		}
		select {
		case <-pace.C:
		case <-r.ctx.Done():
		}
	}
	d.elapsed = time.Since(start)
	return d
}
