package loadgen

import (
	"context"
	"fmt"
	"math"
	"time"
)

// SaturationConfig describes a saturation search in the manner of the
// Porcupine evaluation: offer the mix at a rising rate, open loop, until
// more than MaxShare of the SMTP transactions fail or take longer than
// Bound; then, optionally, narrow the interval between the last rate that
// passed and the first that failed.
type SaturationConfig struct {
	StartRate float64       // first offered rate, tx/s
	Factor    float64       // each step offers Factor times the last (> 1)
	Step      time.Duration // length of one step
	Bound     time.Duration // the latency a transaction must meet
	MaxShare  float64       // tolerated share over Bound, e.g. 0.05
	MaxSteps  int           // stop climbing after this many steps at the latest
	// Retries is how many times a failing step of the climb is run again
	// at the same rate before the failure counts: one transient (a server
	// spawning its processes at the first steps, a burst of compaction)
	// must not end the climb a factor below the peak. Narrowing steps are
	// not repeated: a transient there costs at most the interval.
	Retries int
	// Disturbed, when set, is asked about every step that fails, with the
	// step's start and end. A non-empty answer says why the machine, not
	// the server, failed it (bench/compare: its disk probe saw an
	// fdatasync longer than Bound, which every durable server waits for);
	// the step is then run again at the same rate, without counting
	// against Retries, at most MaxDisturbed times in the whole search. The
	// disturbed step stays in Steps, marked, so the report shows it.
	Disturbed    func(start, end time.Time) string
	MaxDisturbed int
	// Refine is the number of further steps, after the first failure,
	// that each offer the geometric mean of the highest rate that passed
	// and the lowest that failed, halving the interval's ratio in log
	// scale: 4 steps narrow a Factor of 2 to within 4.4%.
	Refine int
}

// SaturationStep is one offered rate and what it achieved.
type SaturationStep struct {
	Rate   float64 `json:"offered_tx_per_sec"`
	Share  float64 `json:"share_over_bound"`
	Passed bool    `json:"passed"`
	// Disturbed is why the step's failure was put down to the machine
	// (SaturationConfig.Disturbed), if it was: the rate was run again.
	Disturbed string     `json:"disturbed,omitempty"`
	Summary   MixSummary `json:"summary"`
}

// SaturationResult is the outcome of Saturate.
type SaturationResult struct {
	Steps []SaturationStep `json:"steps"`
	// PeakRate is the highest offered rate that passed, 0 if none did;
	// PeakDelivered is the delivered msg/s measured at it, and PeakStep
	// its index in Steps (-1 if none passed).
	PeakRate      float64 `json:"peak_offered_tx_per_sec"`
	PeakDelivered float64 `json:"peak_delivered_msg_per_sec"`
	PeakStep      int     `json:"peak_step"`
}

// Saturate runs base (whose Rate and Duration it sets) at rising rates.
// It stops climbing at the first step that fails 1+Retries times (not
// counting the failures Disturbed puts down to the machine), at MaxSteps,
// or when ctx ends, and then runs up to Refine narrowing steps.
func Saturate(ctx context.Context, base MixConfig, sc SaturationConfig) (SaturationResult, error) {
	switch {
	case sc.StartRate <= 0 || sc.Factor <= 1 || sc.Step <= 0 || sc.Bound <= 0:
		return SaturationResult{}, fmt.Errorf("loadgen: saturation needs StartRate > 0, Factor > 1, Step and Bound > 0")
	case sc.MaxShare < 0 || sc.MaxShare >= 1:
		return SaturationResult{}, fmt.Errorf("loadgen: saturation MaxShare %v not in [0, 1)", sc.MaxShare)
	case sc.Refine < 0 || sc.Retries < 0 || sc.MaxDisturbed < 0:
		return SaturationResult{}, fmt.Errorf("loadgen: saturation Refine %d, Retries %d or MaxDisturbed %d < 0", sc.Refine, sc.Retries, sc.MaxDisturbed)
	case sc.MaxSteps <= 0:
		sc.MaxSteps = 20
	}
	res := SaturationResult{PeakStep: -1}
	disturbed := 0
	// once offers rate for one step and records the outcome.
	once := func(rate float64) (SaturationStep, error) {
		start := time.Now()
		cfg := base
		cfg.Rate, cfg.Duration, cfg.LatencyBound = rate, sc.Step, sc.Bound
		// Each step is a separate run: message ids must not collide.
		cfg.Spec.RunID = fmt.Sprintf("%s-s%d", base.Spec.RunID, len(res.Steps))
		sum, err := RunMix(ctx, cfg)
		if err != nil {
			return SaturationStep{}, err
		}
		st := SaturationStep{Rate: rate, Summary: sum}
		// Transactions that never started count against the step.
		if n := sum.SMTP.Attempted + sum.Unstarted; n > 0 {
			st.Share = float64(sum.OverBound+sum.Unstarted) / float64(n)
		} else {
			st.Share = 1
		}
		st.Passed = st.Share <= sc.MaxShare && ctx.Err() == nil
		if !st.Passed && ctx.Err() == nil && sc.Disturbed != nil && disturbed < sc.MaxDisturbed {
			st.Disturbed = sc.Disturbed(start, time.Now())
		}
		res.Steps = append(res.Steps, st)
		if st.Passed && rate > res.PeakRate {
			res.PeakRate, res.PeakStep = rate, len(res.Steps)-1
			res.PeakDelivered = sum.Delivery.MsgPerSec
			if !sum.Delivery.Measured {
				res.PeakDelivered = sum.SMTP.MsgPerSec
			}
		}
		return st, nil
	}
	// run is step, again while the machine is what failed it.
	run := func(rate float64) (bool, error) {
		for {
			st, err := once(rate)
			if err != nil || st.Disturbed == "" {
				return st.Passed, err
			}
			disturbed++
		}
	}
	rate, failed := sc.StartRate, 0.0
	for step := 0; step < sc.MaxSteps && failed == 0 && ctx.Err() == nil; step++ {
		for try := 0; ; try++ {
			ok, err := run(rate)
			if err != nil {
				return res, err
			}
			if ok {
				break
			}
			if try == sc.Retries || ctx.Err() != nil {
				failed = rate
				break
			}
		}
		rate *= sc.Factor
	}
	// Bisect (geometrically) between the highest pass and the lowest
	// failure; with no pass there is nothing to narrow.
	for i := 0; i < sc.Refine && failed > 0 && res.PeakRate > 0 && ctx.Err() == nil; i++ {
		mid := math.Sqrt(res.PeakRate * failed)
		ok, err := run(mid)
		if err != nil {
			return res, err
		}
		if !ok {
			failed = mid
		}
	}
	return res, nil
}
