package main

import (
	"fmt"
	"io"
	"slices"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"quill/internal/loadgen"
)

// figure is one row of the comparison: how to read it from a summary.
type figure struct {
	name string
	get  func(*loadgen.MixSummary) (float64, bool) // false: not applicable
}

func ms(d time.Duration) float64 { return float64(d) / 1e6 }

var figures = []figure{
	{"offered tx/s", func(s *loadgen.MixSummary) (float64, bool) { return s.OfferedRate, s.Mode == "open" }},
	{"accepted msg/s", func(s *loadgen.MixSummary) (float64, bool) { return s.SMTP.MsgPerSec, true }},
	{"delivered msg/s", func(s *loadgen.MixSummary) (float64, bool) { return s.Delivery.MsgPerSec, s.Delivery.Measured }},
	{"visible at end %", func(s *loadgen.MixSummary) (float64, bool) { return 100 * s.Delivery.VisibleAtEnd, s.Delivery.Measured }},
	{"drain after load s", func(s *loadgen.MixSummary) (float64, bool) { return s.Delivery.Drain.Seconds(), s.Delivery.Measured }},
	{"retrieved msg/s", func(s *loadgen.MixSummary) (float64, bool) { return s.POP3.MsgPerSec, s.POP3.Sessions > 0 }},
	{"smtp p50 ms", func(s *loadgen.MixSummary) (float64, bool) { return ms(s.SMTP.Latency.P50), true }},
	{"smtp p99 ms", func(s *loadgen.MixSummary) (float64, bool) { return ms(s.SMTP.Latency.P99), true }},
	{"retrieval session p50 ms", func(s *loadgen.MixSummary) (float64, bool) { return ms(s.POP3.Latency.P50), s.POP3.Sessions > 0 }},
	{"retrieval login p50 ms", func(s *loadgen.MixSummary) (float64, bool) { return ms(s.POP3.Login.P50), s.POP3.Sessions > 0 }},
	{"e2e delivery p50 ms", func(s *loadgen.MixSummary) (float64, bool) { return ms(s.E2E.Latency.P50), s.E2E.Probes > 0 }},
	{"e2e delivery p99 ms", func(s *loadgen.MixSummary) (float64, bool) { return ms(s.E2E.Latency.P99), s.E2E.Probes > 0 }},
	{"cpu ms / delivered msg", func(s *loadgen.MixSummary) (float64, bool) {
		var t time.Duration
		for _, c := range s.CPU {
			t += c.PerDelivered
		}
		return ms(t), len(s.CPU) > 0
	}},
	{"smtp connections / msg", func(s *loadgen.MixSummary) (float64, bool) {
		return float64(s.SMTP.Connections) / float64(s.SMTP.Attempted), s.SMTP.Attempted > 0
	}},
	{"cpu s during load", func(s *loadgen.MixSummary) (float64, bool) {
		var t time.Duration
		for _, c := range s.CPU {
			t += c.Load
		}
		return t.Seconds(), len(s.CPU) > 0
	}},
	{"failed transactions", func(s *loadgen.MixSummary) (float64, bool) {
		return float64(s.SMTP.Rejected + s.SMTP.NoReply + s.POP3.Failed + s.E2E.Lost), true
	}},
}

// median of the applicable values of f over runs.
func median(runs []loadgen.MixSummary, f figure) (float64, bool) {
	var v []float64
	for i := range runs {
		if x, ok := f.get(&runs[i]); ok {
			v = append(v, x)
		}
	}
	if len(v) == 0 {
		return 0, false
	}
	sort.Float64s(v)
	n := len(v)
	if n%2 == 1 {
		return v[n/2], true
	}
	return (v[n/2-1] + v[n/2]) / 2, true
}

// column is a target of the comparison and its heading.
type column struct{ target, heading string }

// columns are the targets of the comparison, in the order of the runs.
var columns = []column{
	{"quill", "quill"},
	{"baseline", "baseline"},
	{"peer", "postfix+dovecot"},
	{"sink", "sink"},
	{"durable-sink", "durable-sink"},
	{"mail-floor", "mail-floor"},
	{"volatile-floor", "volatile-floor"},
}

// shares are the ratios printed below the table: the median of figure num
// for target of, as a share of the median of figure den for target per.
var shares = []struct {
	label    string
	of, per  string
	num, den string // figure names
}{
	{"quill delivered / baseline delivered", "quill", "baseline", "delivered msg/s", "delivered msg/s"},
	{"quill cpu / baseline cpu per delivered msg", "quill", "baseline", "cpu ms / delivered msg", "cpu ms / delivered msg"},
	{"quill delivered / sink accepted", "quill", "sink", "delivered msg/s", "accepted msg/s"},
	{"durable-sink accepted / sink accepted", "durable-sink", "sink", "accepted msg/s", "accepted msg/s"},
	{"quill delivered / durable-sink accepted", "quill", "durable-sink", "delivered msg/s", "accepted msg/s"},
	{"mail-floor delivered / sink accepted", "mail-floor", "sink", "delivered msg/s", "accepted msg/s"},
	{"quill delivered / mail-floor delivered", "quill", "mail-floor", "delivered msg/s", "delivered msg/s"},
	{"volatile-floor delivered / sink accepted", "volatile-floor", "sink", "delivered msg/s", "accepted msg/s"},
	{"mail-floor delivered / volatile-floor delivered", "mail-floor", "volatile-floor", "delivered msg/s", "delivered msg/s"},
}

// figureNamed returns the figure called name; the names are this file's
// constants, so a miss is a programming error.
func figureNamed(name string) figure {
	for _, f := range figures {
		if f.name == name {
			return f
		}
	}
	panic("compare: no figure " + name)
}

// printComparison prints the medians, the Quill/peer ratio, and the
// delivered or accepted rates as shares of one another (see shares).
func printComparison(w io.Writer, results map[string][]loadgen.MixSummary) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	runs := 0
	for _, r := range results {
		runs = max(runs, len(r))
	}
	fmt.Fprintf(tw, "median of %d runs\t", runs)
	for _, c := range columns {
		fmt.Fprintf(tw, "%s\t", c.heading)
	}
	fmt.Fprintf(tw, "quill/peer\t\n")
	cell := func(v float64, ok bool) string {
		if !ok {
			return "-"
		}
		return fmt.Sprintf("%.1f", v)
	}
	for _, f := range figures {
		fmt.Fprintf(tw, "%s\t", f.name)
		for _, c := range columns {
			fmt.Fprintf(tw, "%s\t", cell(median(results[c.target], f)))
		}
		q, qok := median(results["quill"], f)
		p, pok := median(results["peer"], f)
		ratio := "-"
		if qok && pok && p != 0 {
			ratio = fmt.Sprintf("%.2fx", q/p)
		}
		fmt.Fprintf(tw, "%s\t\n", ratio)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	sep := "\n"
	for _, sh := range shares {
		n, nok := median(results[sh.of], figureNamed(sh.num))
		d, dok := median(results[sh.per], figureNamed(sh.den))
		if nok && dok && d > 0 {
			// A saturation search that passes no rate adds no run, so
			// the two medians can be of different rounds: say so.
			unpaired := ""
			if a, b := len(results[sh.of]), len(results[sh.per]); a != b {
				unpaired = fmt.Sprintf(" (medians of %d and %d runs: not paired by round)", a, b)
			}
			fmt.Fprintf(w, "%s%s: %.1f%%%s\n", sep, sh.label, 100*n/d, unpaired)
			sep = ""
		}
	}
	return nil
}

// printSteps prints one saturation search, a line per offered rate.
func printSteps(w io.Writer, name string, res loadgen.SaturationResult, bound time.Duration) {
	for i, st := range res.Steps {
		verdict := "fail"
		if st.Passed {
			verdict = "pass"
		}
		if i == res.PeakStep {
			verdict = "pass (peak)"
		}
		if st.Disturbed != "" {
			verdict += " (" + st.Disturbed + ": run again)"
		}
		rate, what := st.Summary.Delivery.MsgPerSec, "delivered"
		if !st.Summary.Delivery.Measured {
			rate, what = st.Summary.SMTP.MsgPerSec, "accepted"
		}
		e2e := ""
		if st.Summary.E2E.Probes > 0 {
			e2e = fmt.Sprintf(", e2e p50 %.1f ms", ms(st.Summary.E2E.Latency.P50))
		}
		fmt.Fprintf(w, "compare: %s offered %.0f tx/s: %s %.1f msg/s, smtp p99 %.1f ms%s, %.1f%% over %v or unstarted: %s\n",
			name, st.Rate, what, rate, ms(st.Summary.SMTP.Latency.P99), e2e, 100*st.Share, bound, verdict)
	}
}

func splitLines(s string) []string { return strings.Split(s, "\n") }

// cutField splits a "key\t: value" line of /proc/cpuinfo.
func cutField(line string) (string, string, bool) {
	k, v, ok := strings.Cut(line, ":")
	return strings.TrimSpace(k), strings.TrimSpace(v), ok
}

func trimNL(s string) string { return strings.TrimRight(s, "\n") }

// disturbed reports whether other processes took more than maxOther of the
// machine's CPU during s's load, and what share they took.
func disturbed(s *loadgen.MixSummary, maxOther float64) (float64, bool) {
	if s.Machine == nil {
		return 0, false
	}
	return s.Machine.OtherShare, s.Machine.OtherShare > maxOther
}

// undisturbed returns results without the disturbed runs (see disturbed),
// except that a target whose every run was disturbed keeps them all, and
// counts the runs left out and all runs.
func undisturbed(results map[string][]loadgen.MixSummary, maxOther float64) (kept map[string][]loadgen.MixSummary, dropped, total int) {
	kept = make(map[string][]loadgen.MixSummary, len(results))
	for name, runs := range results {
		var ok []loadgen.MixSummary
		for i := range runs {
			if _, d := disturbed(&runs[i], maxOther); !d {
				ok = append(ok, runs[i])
			}
		}
		if len(ok) == 0 {
			ok = runs
		}
		kept[name] = ok
		dropped += len(runs) - len(ok)
		total += len(runs)
	}
	return kept, dropped, total
}

// cpuPerMsg is the figure the connection cost is judged by: server CPU per
// delivered message, the least sensitive to a shared machine.
var cpuPerMsg = figureNamed("cpu ms / delivered msg")

// printConnCost prints, per target, the server's CPU per delivered message
// in connection mode a over that in mode b, round by round (the two runs
// of a round are back to back on the same store) with the two runs'
// delivered (or accepted) rates, and its median over the rounds where
// neither run was disturbed (all rounds if none is). In closed loop the
// two rates differ, and a server's CPU per message falls as its rate rises
// (a group commit shares one fdatasync among more messages): an open-loop
// run (--rate) compares the modes at one rate.
func printConnCost(w io.Writer, a, b string, results map[string]map[string][]loadgen.MixSummary, maxOther float64) error {
	if _, err := fmt.Fprintf(w, "server cpu per delivered msg, %s / %s, per round (* disturbed; at the two runs' msg/s) and median:\n", a, b); err != nil {
		return err
	}
	for _, c := range columns {
		ra, rb := results[a][c.target], results[b][c.target]
		n := min(len(ra), len(rb))
		if n == 0 {
			continue
		}
		var cells []string
		var all, clean []float64
		for i := 0; i < n; i++ {
			x, okA := cpuPerMsg.get(&ra[i])
			y, okB := cpuPerMsg.get(&rb[i])
			if !okA || !okB || y == 0 {
				continue
			}
			r := x / y
			_, da := disturbed(&ra[i], maxOther)
			_, db := disturbed(&rb[i], maxOther)
			mark := ""
			if da || db {
				mark = "*"
			} else {
				clean = append(clean, r)
			}
			all = append(all, r)
			cells = append(cells, fmt.Sprintf("%.3f/%.3f ms = %.2fx%s at %.0f/%.0f", x, y, r, mark, rate(&ra[i]), rate(&rb[i])))
		}
		if len(all) == 0 {
			continue
		}
		if len(clean) == 0 {
			clean = all
		}
		if _, err := fmt.Fprintf(w, "  %s: median %.2fx (%s)\n", c.heading, medianOf(clean), strings.Join(cells, "; ")); err != nil {
			return err
		}
	}
	return nil
}

// rate is a run's delivered msg/s, or its accepted msg/s where delivery
// is not measured (the sinks).
func rate(s *loadgen.MixSummary) float64 {
	if s.Delivery.Measured {
		return s.Delivery.MsgPerSec
	}
	return s.SMTP.MsgPerSec
}

func medianOf(v []float64) float64 {
	v = slices.Clone(v)
	sort.Float64s(v)
	n := len(v)
	if n%2 == 1 {
		return v[n/2]
	}
	return (v[n/2-1] + v[n/2]) / 2
}

// printRounds prints every round of each target beside the disk probe of
// that round and the share of the machine other processes took: a median
// can hide a round that measured the disk (a durable target whose probe
// saw long syncs and whose server used little CPU) or another process.
func printRounds(w io.Writer, results map[string][]loadgen.MixSummary, disk map[string][]probeStats, saturate bool, maxOther float64) error {
	span := "the run"
	if saturate {
		span = "the whole search"
	}
	if _, err := fmt.Fprintf(w, "per round: delivered msg/s (the sinks: accepted), server CPU s during the load, the disk probe's fdatasync p99 and max over %s, "+
		"and other processes' share of the machine\n", span); err != nil {
		return err
	}
	delivered, accepted, cpu := figureNamed("delivered msg/s"), figureNamed("accepted msg/s"), figureNamed("cpu s during load")
	for _, c := range columns {
		runs := results[c.target]
		if len(runs) == 0 {
			continue
		}
		var cells []string
		for i := range runs {
			v, ok := delivered.get(&runs[i])
			if !ok {
				v, _ = accepted.get(&runs[i])
			}
			cell := fmt.Sprintf("%.1f", v)
			if s, ok := cpu.get(&runs[i]); ok {
				cell += fmt.Sprintf(" on %.1f CPU-s", s)
			}
			if ps := disk[c.target]; i < len(ps) {
				cell += fmt.Sprintf(", probe p99 %.2f ms max %.1f ms", ms(ps[i].P99), ms(ps[i].Max))
			}
			if runs[i].Machine != nil {
				share, d := disturbed(&runs[i], maxOther)
				cell += fmt.Sprintf(", others %.0f%%", 100*share)
				if d {
					cell += " DISTURBED"
				}
			}
			cells = append(cells, cell)
		}
		if _, err := fmt.Fprintf(w, "  %s: %s\n", c.heading, strings.Join(cells, "; ")); err != nil {
			return err
		}
	}
	return nil
}
