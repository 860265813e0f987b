package main

import (
	"fmt"
	"io"
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
	{"accepted msg/s", func(s *loadgen.MixSummary) (float64, bool) { return s.SMTP.MsgPerSec, true }},
	{"delivered msg/s", func(s *loadgen.MixSummary) (float64, bool) { return s.Delivery.MsgPerSec, s.Delivery.Measured }},
	{"visible at end %", func(s *loadgen.MixSummary) (float64, bool) { return 100 * s.Delivery.VisibleAtEnd, s.Delivery.Measured }},
	{"drain after load s", func(s *loadgen.MixSummary) (float64, bool) { return s.Delivery.Drain.Seconds(), s.Delivery.Measured }},
	{"retrieved msg/s", func(s *loadgen.MixSummary) (float64, bool) { return s.POP3.MsgPerSec, s.POP3.Sessions > 0 }},
	{"smtp p50 ms", func(s *loadgen.MixSummary) (float64, bool) { return ms(s.SMTP.Latency.P50), true }},
	{"smtp p99 ms", func(s *loadgen.MixSummary) (float64, bool) { return ms(s.SMTP.Latency.P99), true }},
	{"pop3 session p50 ms", func(s *loadgen.MixSummary) (float64, bool) { return ms(s.POP3.Latency.P50), s.POP3.Sessions > 0 }},
	{"pop3 login p50 ms", func(s *loadgen.MixSummary) (float64, bool) { return ms(s.POP3.Login.P50), s.POP3.Sessions > 0 }},
	{"e2e delivery p50 ms", func(s *loadgen.MixSummary) (float64, bool) { return ms(s.E2E.Latency.P50), s.E2E.Probes > 0 }},
	{"e2e delivery p99 ms", func(s *loadgen.MixSummary) (float64, bool) { return ms(s.E2E.Latency.P99), s.E2E.Probes > 0 }},
	{"cpu ms / delivered msg", func(s *loadgen.MixSummary) (float64, bool) {
		var t time.Duration
		for _, c := range s.CPU {
			t += c.PerDelivered
		}
		return ms(t), len(s.CPU) > 0
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

// printComparison prints the medians, the Quill/peer ratio, and Quill's
// delivered rate as a share of the sink's accepted rate.
func printComparison(w io.Writer, results map[string][]loadgen.MixSummary) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(tw, "median of %d runs\tquill\tpostfix+dovecot\tsink\tquill/peer\t\n", len(results["quill"]))
	cell := func(v float64, ok bool) string {
		if !ok {
			return "-"
		}
		return fmt.Sprintf("%.1f", v)
	}
	for _, f := range figures {
		q, qok := median(results["quill"], f)
		p, pok := median(results["peer"], f)
		s, sok := median(results["sink"], f)
		ratio := "-"
		if qok && pok && p != 0 {
			ratio = fmt.Sprintf("%.2fx", q/p)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t\n", f.name, cell(q, qok), cell(p, pok), cell(s, sok), ratio)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	q, qok := median(results["quill"], figures[1])
	s, sok := median(results["sink"], figures[0])
	if qok && sok && s > 0 {
		fmt.Fprintf(w, "\nquill delivered / sink accepted: %.1f%%\n", 100*q/s)
	}
	return nil
}

func splitLines(s string) []string { return strings.Split(s, "\n") }

// cutField splits a "key\t: value" line of /proc/cpuinfo.
func cutField(line string) (string, string, bool) {
	k, v, ok := strings.Cut(line, ":")
	return strings.TrimSpace(k), strings.TrimSpace(v), ok
}

func trimNL(s string) string { return strings.TrimRight(s, "\n") }
