package loadgen

import (
	"fmt"
	"io"
	"math"
	"runtime"
	"sort"
	"text/tabwriter"
	"time"
)

// MixSummary is the result of RunMix. Rates are per second of the load
// phase (Elapsed), which excludes the drain.
type MixSummary struct {
	Mode        string        `json:"mode"` // "closed" or "open"
	Clients     int           `json:"clients"`
	OfferedRate float64       `json:"offered_tx_per_sec,omitempty"`
	Elapsed     time.Duration `json:"elapsed_ns"`

	SMTP Summary `json:"smtp"`
	// OverBound counts SMTP transactions that failed or exceeded
	// MixConfig.LatencyBound.
	OverBound int64 `json:"smtp_over_bound"`
	// Unstarted counts, in open loop, transactions that fell due before
	// the end but never started because every client was busy: the
	// server was too slow for the offered rate.
	Unstarted int64 `json:"unstarted,omitempty"`

	// Retrieval is the protocol of the retrieval sessions, the prober and
	// the drain: "pop3" or "imap". POP3 holds the sessions' figures
	// whichever it was (the field keeps its name for old readers).
	Retrieval string      `json:"retrieval"`
	POP3      POP3Summary `json:"pop3"`

	Delivery DeliverySummary `json:"delivery"`

	// E2E is the SMTP-ack to visible-at-login latency of the probes.
	E2E E2ESummary `json:"e2e"`

	// CPU is the CPU time of each measured server process tree.
	CPU map[string]CPUSummary `json:"cpu,omitempty"`
	// Machine is the whole machine's CPU during the load phase, set when
	// server processes are measured: what else ran beside them.
	Machine *MachineCPU `json:"machine,omitempty"`
}

// MachineCPU accounts for all the machine's CPU time during the load phase
// (/proc/stat), so that a run disturbed by other work on the machine can be
// told from one that measured the server: Other is what neither the
// measured servers nor the generator used.
type MachineCPU struct {
	CPUs      int           `json:"cpus"`
	Busy      time.Duration `json:"busy_ns"`      // all CPUs, not idle
	Servers   time.Duration `json:"servers_ns"`   // the measured process trees
	Generator time.Duration `json:"generator_ns"` // this process
	Other     time.Duration `json:"other_ns"`     // Busy - Servers - Generator, at least 0
	// OtherShare is Other over the machine's capacity during the load
	// (Elapsed times CPUs): the share of the machine taken by others.
	OtherShare float64 `json:"other_share"`
}

// POP3Summary covers the mix's retrieval sessions, POP3 or IMAP.
type POP3Summary struct {
	Sessions int64 `json:"sessions"`
	Failed   int64 `json:"failed"`
	// InUse counts sessions not run because another held the mailbox:
	// POP3 logins refused with [IN-USE], and in IMAP mode sessions for a
	// user whose previous one was still in flight.
	InUse          int64   `json:"in_use"`
	Retrieved      int64   `json:"retrieved"`
	RetrievedBytes int64   `json:"retrieved_bytes"`
	MsgPerSec      float64 `json:"retrieved_msg_per_sec"`
	Latency        Latency `json:"session_latency"`
	Login          Latency `json:"login_latency"`
}

// DeliverySummary says how much of what was acknowledged was visible in
// the mailboxes, measured on the sampled mailboxes.
type DeliverySummary struct {
	Measured        bool  `json:"measured"`
	SampleMailboxes int   `json:"sample_mailboxes"`
	SampleAcked     int64 `json:"sample_acked"`
	// VisibleAtEnd is the share of SampleAcked retrieved by the mix or
	// found by the first drain round, right after the load stopped.
	VisibleAtEnd float64 `json:"visible_at_end"`
	// MsgPerSec is SMTP acked msg/s times VisibleAtEnd: the delivered rate.
	MsgPerSec     float64       `json:"delivered_msg_per_sec"`
	Drain         time.Duration `json:"drain_ns"`
	DrainRounds   int           `json:"drain_rounds"`
	DrainComplete bool          `json:"drain_complete"`
	// Missing counts sampled acknowledged deliveries never seen.
	Missing int64 `json:"missing"`
}

// E2ESummary is the prober's result.
type E2ESummary struct {
	Probes  int64   `json:"probes"`
	Lost    int64   `json:"lost"`
	Errors  int64   `json:"errors"`
	Latency Latency `json:"latency"`
}

// CPUSummary is one server process tree's CPU use.
type CPUSummary struct {
	Load  time.Duration `json:"load_ns"`  // during the load phase
	Total time.Duration `json:"total_ns"` // load phase and drain
	// PerDelivered is Total over the acknowledged messages that were
	// delivered (all of them when the drain completed).
	PerDelivered time.Duration `json:"per_delivered_ns"`
}

func latencyOf(h *histogram) Latency {
	return Latency{P50: h.quantile(0.50), P90: h.quantile(0.90), P99: h.quantile(0.99), Max: time.Duration(h.max)}
}

func (r *mixRun) summarize(elapsed time.Duration, workers []*mixWorker, pr *prober, d drainResult, cpu0, cpu1, cpu2 map[string]time.Duration, m0, m1 machineSnap) MixSummary {
	cfg := r.cfg
	s := MixSummary{Mode: "closed", Clients: cfg.Clients, Elapsed: elapsed, Retrieval: cfg.Retrieval}
	if cfg.Rate > 0 {
		s.Mode, s.OfferedRate = "open", cfg.Rate
	}
	ws := make([]*workerStats, len(workers))
	var lat, login histogram
	for i, w := range workers {
		ws[i] = &w.st
		s.OverBound += w.overBnd
		p := &w.pop
		s.POP3.Sessions += p.sessions
		s.POP3.Failed += p.failed
		s.POP3.InUse += p.inUse
		s.POP3.Retrieved += p.msgs
		s.POP3.RetrievedBytes += p.bytes
		lat.merge(&p.lat)
		login.merge(&p.login)
	}
	s.SMTP = summarize(elapsed, ws)
	if cfg.Rate > 0 {
		offered := int64(math.Ceil(cfg.Duration.Seconds() * cfg.Rate))
		s.Unstarted = max(offered-s.SMTP.Attempted-s.POP3.Sessions, 0)
	}
	s.POP3.Latency, s.POP3.Login = latencyOf(&lat), latencyOf(&login)
	if elapsed > 0 {
		s.POP3.MsgPerSec = float64(s.POP3.Retrieved) / elapsed.Seconds()
	}

	delivered := float64(s.SMTP.Acked)
	if len(cfg.Sample) > 0 {
		dv := &s.Delivery
		dv.Measured = true
		dv.SampleMailboxes = len(cfg.Sample)
		dv.SampleAcked = d.sampleAcked
		dv.Drain, dv.DrainRounds, dv.DrainComplete = d.elapsed, d.rounds, d.complete
		dv.Missing = max(d.sampleAcked-d.fetchedInRun-d.found, 0)
		dv.VisibleAtEnd = 1
		if d.sampleAcked > 0 {
			dv.VisibleAtEnd = min(float64(d.fetchedInRun+d.firstRound)/float64(d.sampleAcked), 1)
			delivered *= min(float64(d.fetchedInRun+d.found)/float64(d.sampleAcked), 1)
		}
		dv.MsgPerSec = s.SMTP.MsgPerSec * dv.VisibleAtEnd
	}
	if pr != nil {
		s.E2E = E2ESummary{Probes: pr.sent, Lost: pr.lost, Errors: pr.errs, Latency: latencyOf(&pr.e2e)}
	}
	for name := range cpu0 {
		if s.CPU == nil {
			s.CPU = make(map[string]CPUSummary)
		}
		c := CPUSummary{Load: cpu1[name] - cpu0[name], Total: cpu2[name] - cpu0[name]}
		if delivered >= 1 {
			c.PerDelivered = time.Duration(float64(c.Total) / delivered)
		}
		s.CPU[name] = c
	}
	if len(cpu0) > 0 && m0.ok && m1.ok && elapsed > 0 {
		mc := &MachineCPU{CPUs: runtime.NumCPU(), Busy: ticksDuration(m1.busy - m0.busy), Generator: ticksDuration(m1.self - m0.self)}
		for _, c := range s.CPU {
			mc.Servers += c.Load
		}
		mc.Other = max(mc.Busy-mc.Servers-mc.Generator, 0)
		mc.OtherShare = float64(mc.Other) / (float64(elapsed) * float64(mc.CPUs))
		s.Machine = mc
	}
	return s
}

// WriteTable writes s for a human.
func (s *MixSummary) WriteTable(w io.Writer) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	row := func(k string, format string, args ...any) {
		fmt.Fprintf(tw, "%s\t"+format+"\n", append([]any{k}, args...)...)
	}
	ms := func(d time.Duration) string { return fmt.Sprintf("%.1f ms", float64(d)/1e6) }
	lat := func(name string, l Latency) {
		row(name, "p50 %s  p90 %s  p99 %s  max %s", ms(l.P50), ms(l.P90), ms(l.P99), ms(l.Max))
	}
	mode := s.Mode
	if s.Mode == "open" {
		mode = fmt.Sprintf("open loop, %.0f tx/s offered, %d never started", s.OfferedRate, s.Unstarted)
	}
	row("mode", "%s, %d clients, %v", mode, s.Clients, s.Elapsed.Round(time.Millisecond))
	row("smtp", "%d attempted, %d acked, %d rejected, %d no reply, %d connections", s.SMTP.Attempted, s.SMTP.Acked, s.SMTP.Rejected, s.SMTP.NoReply, s.SMTP.Connections)
	row("accepted msg/s", "%.1f", s.SMTP.MsgPerSec)
	if s.Delivery.Measured {
		d := s.Delivery
		row("delivered msg/s", "%.1f (%.1f%% of the sample visible at the end)", d.MsgPerSec, 100*d.VisibleAtEnd)
		row("drain", "%v, %d rounds, complete=%v, missing=%d of %d sampled", d.Drain.Round(time.Millisecond), d.DrainRounds, d.DrainComplete, d.Missing, d.SampleAcked)
	} else {
		row("delivered msg/s", "not measured")
	}
	row("retrieved msg/s", "%.1f (%d sessions, %d failed, %d in use)", s.POP3.MsgPerSec, s.POP3.Sessions, s.POP3.Failed, s.POP3.InUse)
	lat("smtp latency", s.SMTP.Latency)
	if s.POP3.Sessions > 0 {
		proto := s.Retrieval
		if proto == "" {
			proto = RetrievalPOP3 // a summary from before the field
		}
		lat(proto+" session", s.POP3.Latency)
		lat(proto+" login", s.POP3.Login)
	}
	if s.E2E.Probes > 0 || s.E2E.Lost > 0 {
		lat("e2e delivery", s.E2E.Latency)
		row("e2e probes", "%d, %d lost, %d errors", s.E2E.Probes, s.E2E.Lost, s.E2E.Errors)
	}
	names := make([]string, 0, len(s.CPU))
	for n := range s.CPU {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		c := s.CPU[n]
		row("cpu "+n, "%.2f s load, %.2f s total, %.3f ms per delivered msg", c.Load.Seconds(), c.Total.Seconds(), float64(c.PerDelivered)/1e6)
	}
	if m := s.Machine; m != nil {
		row("cpu machine", "%.2f s busy of %d CPUs: servers %.2f s, generator %.2f s, others %.2f s (%.1f%% of the machine)",
			m.Busy.Seconds(), m.CPUs, m.Servers.Seconds(), m.Generator.Seconds(), m.Other.Seconds(), 100*m.OtherShare)
	}
	codes := make([]int, 0, len(s.SMTP.RejectCodes))
	for c := range s.SMTP.RejectCodes {
		codes = append(codes, c)
	}
	sort.Ints(codes)
	for _, c := range codes {
		row(fmt.Sprintf("rejected %d", c), "%d", s.SMTP.RejectCodes[c])
	}
	kinds := make([]string, 0, len(s.SMTP.Errors))
	for k := range s.SMTP.Errors {
		kinds = append(kinds, k)
	}
	sort.Strings(kinds)
	for _, k := range kinds {
		row("errors "+k, "%d", s.SMTP.Errors[k])
	}
	return tw.Flush()
}
