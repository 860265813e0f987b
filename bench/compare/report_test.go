package main

import (
	"bytes"
	"strings"
	"testing"

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
