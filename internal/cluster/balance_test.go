package cluster

import (
	"testing"
	"time"

	"quill/internal/cluster/membership"
)

// TestBalancerSteps: sustained overload lowers the weight a step per
// ShedAfter down to a quarter; sustained calm raises it a step per
// RestoreAfter; a load that comes and goes moves nothing.
func TestBalancerSteps(t *testing.T) {
	t0 := time.Unix(1_800_000_000, 0)
	at := func(d time.Duration) time.Time { return t0.Add(d) }
	const full = membership.DefaultWeight
	b := &balancer{weight: full}
	steps := []struct {
		at         time.Duration
		overloaded bool
		want       uint32
	}{
		{0, false, full},
		{time.Second, true, full},
		{time.Second + ShedAfter - time.Millisecond, true, full},
		{time.Second + ShedAfter, true, full / 2},
		{time.Second + 2*ShedAfter - time.Millisecond, true, full / 2},
		{time.Second + 2*ShedAfter, true, full / 4},
		{time.Second + 5*ShedAfter, true, full / 4}, // the floor
		// Calm, interrupted once: the wait starts again.
		{60 * time.Second, false, full / 4},
		{60*time.Second + RestoreAfter/2, true, full / 4},
		{61*time.Second + RestoreAfter/2, false, full / 4},
		{61*time.Second + RestoreAfter/2 + RestoreAfter - time.Millisecond, false, full / 4},
		{61*time.Second + RestoreAfter/2 + RestoreAfter, false, full / 2},
		{61*time.Second + RestoreAfter/2 + 2*RestoreAfter, false, full},
		{61*time.Second + RestoreAfter/2 + 9*RestoreAfter, false, full},
	}
	for _, s := range steps {
		if got := b.step(s.overloaded, at(s.at)); got != s.want {
			t.Fatalf("at %v (overloaded %v): weight %d, want %d", s.at, s.overloaded, got, s.want)
		}
	}
	// Overload that never lasts ShedAfter moves nothing.
	b = &balancer{weight: full}
	for i := 0; i < 100; i++ {
		if got := b.step(i%8 < 4, at(time.Duration(i)*time.Second)); got != full {
			t.Fatalf("flapping load at %ds: weight %d", i, got)
		}
	}
}
