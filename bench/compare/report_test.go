package main

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"quill/internal/loadgen"
)

// TestSharesUseTheirFigures: every ratio below the table divides the figures
// it names, whatever rows the table has (open-loop runs add "offered tx/s").
func TestSharesUseTheirFigures(t *testing.T) {
	run := func(mode string, offered, accepted, delivered float64) loadgen.MixSummary {
		s := loadgen.MixSummary{Mode: mode, OfferedRate: offered}
		s.SMTP.MsgPerSec = accepted
		if delivered > 0 {
			s.Delivery.Measured, s.Delivery.MsgPerSec = true, delivered
		}
		return s
	}
	for _, mode := range []string{"closed", "open"} {
		results := map[string][]loadgen.MixSummary{
			"quill":          {run(mode, 9000, 6000, 5000)},
			"peer":           {run(mode, 400, 300, 250)},
			"sink":           {run(mode, 30000, 20000, 0)},
			"durable-sink":   {run(mode, 30000, 16000, 0)},
			"mail-floor":     {run(mode, 15000, 12000, 10000)},
			"volatile-floor": {run(mode, 16000, 12800, 12500)},
		}
		var out bytes.Buffer
		if err := printComparison(&out, results); err != nil {
			t.Fatal(err)
		}
		for _, want := range []string{
			"quill delivered / sink accepted: 25.0%",
			"durable-sink accepted / sink accepted: 80.0%",
			"quill delivered / durable-sink accepted: 31.2%",
			"mail-floor delivered / sink accepted: 50.0%",
			"quill delivered / mail-floor delivered: 50.0%",
			"volatile-floor delivered / sink accepted: 62.5%",
			"mail-floor delivered / volatile-floor delivered: 80.0%",
		} {
			if !strings.Contains(out.String(), want) {
				t.Errorf("%s loop: no %q in\n%s", mode, want, out.String())
			}
		}
		if strings.Contains(out.String(), "not paired") {
			t.Errorf("%s loop: one run each, yet a ratio is marked unpaired:\n%s", mode, out.String())
		}
		// A target with a round missing (a search that passed no rate).
		results["sink"] = append(results["sink"], run(mode, 30000, 20000, 0))
		out.Reset()
		if err := printComparison(&out, results); err != nil {
			t.Fatal(err)
		}
		if want := "quill delivered / sink accepted: 25.0% (medians of 1 and 2 runs: not paired by round)"; !strings.Contains(out.String(), want) {
			t.Errorf("%s loop: no %q in\n%s", mode, want, out.String())
		}
		hasOffered := strings.Contains(out.String(), "offered tx/s  9000.0")
		if hasOffered != (mode == "open") {
			t.Errorf("%s loop: offered row shown %v:\n%s", mode, hasOffered, out.String())
		}
	}
}

// TestDisturbedRunsAndConnCost: a run during which other processes took more
// than the bound is marked in the rounds, left out of the medians, and
// starred in the per-round ratio of the connection modes, whose median is
// over the clean rounds.
func TestDisturbedRunsAndConnCost(t *testing.T) {
	run := func(cpuPerMsg time.Duration, other float64) loadgen.MixSummary {
		s := loadgen.MixSummary{Mode: "closed"}
		s.SMTP.MsgPerSec, s.SMTP.Attempted, s.SMTP.Connections = 1000, 100, 100
		s.CPU = map[string]loadgen.CPUSummary{"quill": {PerDelivered: cpuPerMsg, Load: time.Second}}
		s.Machine = &loadgen.MachineCPU{CPUs: 2, OtherShare: other}
		return s
	}
	results := map[string]map[string][]loadgen.MixSummary{
		"one":        {"quill": {run(300*time.Microsecond, 0.02), run(900*time.Microsecond, 0.40), run(260*time.Microsecond, 0.05)}},
		"persistent": {"quill": {run(200*time.Microsecond, 0.03), run(200*time.Microsecond, 0.01), run(200*time.Microsecond, 0.04)}},
	}
	kept, dropped, total := undisturbed(results["one"], 0.1)
	if dropped != 1 || total != 3 || len(kept["quill"]) != 2 {
		t.Fatalf("kept %d, dropped %d of %d", len(kept["quill"]), dropped, total)
	}
	if v, _ := median(kept["quill"], cpuPerMsg); v != 0.28 {
		t.Errorf("median cpu per msg of the clean runs %.3f ms, want 0.280", v)
	}
	var out bytes.Buffer
	if err := printConnCost(&out, "one", "persistent", results, 0.1); err != nil {
		t.Fatal(err)
	}
	// Clean rounds: 1.50 and 1.30; their median 1.40.
	want := "quill: median 1.40x (0.300/0.200 ms = 1.50x at 1000/1000; 0.900/0.200 ms = 4.50x* at 1000/1000; 0.260/0.200 ms = 1.30x at 1000/1000)"
	if !strings.Contains(out.String(), want) {
		t.Errorf("no %q in\n%s", want, out.String())
	}
	out.Reset()
	if err := printRounds(&out, results["one"], nil, false, 0.1); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "others 40% DISTURBED") || strings.Count(out.String(), "DISTURBED") != 1 {
		t.Errorf("rounds:\n%s", out.String())
	}
}
