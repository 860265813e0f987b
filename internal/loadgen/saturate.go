package loadgen

import (
	"context"
	"fmt"
	"time"
)

// SaturationConfig describes a saturation search in the manner of the
// Porcupine evaluation: offer the mix at a rising rate, open loop, until
// more than MaxShare of the SMTP transactions fail or take longer than
// Bound.
type SaturationConfig struct {
	StartRate float64       // first offered rate, tx/s
	Factor    float64       // each step offers Factor times the last (> 1)
	Step      time.Duration // length of one step
	Bound     time.Duration // the latency a transaction must meet
	MaxShare  float64       // tolerated share over Bound, e.g. 0.05
	MaxSteps  int           // stop after this many steps at the latest
}

// SaturationStep is one offered rate and what it achieved.
type SaturationStep struct {
	Rate    float64    `json:"offered_tx_per_sec"`
	Share   float64    `json:"share_over_bound"`
	Passed  bool       `json:"passed"`
	Summary MixSummary `json:"summary"`
}

// SaturationResult is the outcome of Saturate.
type SaturationResult struct {
	Steps []SaturationStep `json:"steps"`
	// PeakRate is the highest offered rate that passed, 0 if none did;
	// PeakDelivered is the delivered msg/s measured at it.
	PeakRate      float64 `json:"peak_offered_tx_per_sec"`
	PeakDelivered float64 `json:"peak_delivered_msg_per_sec"`
}

// Saturate runs base (whose Rate and Duration it sets) at rising rates.
// It stops at the first failing step, at MaxSteps, or when ctx ends.
func Saturate(ctx context.Context, base MixConfig, sc SaturationConfig) (SaturationResult, error) {
	switch {
	case sc.StartRate <= 0 || sc.Factor <= 1 || sc.Step <= 0 || sc.Bound <= 0:
		return SaturationResult{}, fmt.Errorf("loadgen: saturation needs StartRate > 0, Factor > 1, Step and Bound > 0")
	case sc.MaxShare < 0 || sc.MaxShare >= 1:
		return SaturationResult{}, fmt.Errorf("loadgen: saturation MaxShare %v not in [0, 1)", sc.MaxShare)
	case sc.MaxSteps <= 0:
		sc.MaxSteps = 20
	}
	var res SaturationResult
	rate := sc.StartRate
	for step := 0; step < sc.MaxSteps && ctx.Err() == nil; step++ {
		cfg := base
		cfg.Rate, cfg.Duration, cfg.LatencyBound = rate, sc.Step, sc.Bound
		// Each step is a separate run: message ids must not collide.
		cfg.Spec.RunID = fmt.Sprintf("%s-s%d", base.Spec.RunID, step)
		sum, err := RunMix(ctx, cfg)
		if err != nil {
			return res, err
		}
		st := SaturationStep{Rate: rate, Summary: sum}
		// Transactions that never started count against the step.
		if n := sum.SMTP.Attempted + sum.Unstarted; n > 0 {
			st.Share = float64(sum.OverBound+sum.Unstarted) / float64(n)
		} else {
			st.Share = 1
		}
		st.Passed = st.Share <= sc.MaxShare && ctx.Err() == nil
		res.Steps = append(res.Steps, st)
		if !st.Passed {
			break
		}
		res.PeakRate = rate
		res.PeakDelivered = sum.Delivery.MsgPerSec
		if !sum.Delivery.Measured {
			res.PeakDelivered = sum.SMTP.MsgPerSec
		}
		rate *= sc.Factor
	}
	return res, nil
}
