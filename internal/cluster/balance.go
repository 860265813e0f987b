package cluster

import (
	"context"
	"time"

	"quill/internal/cluster/membership"
)

// Dynamic load balancing of soft state (the cluster issue's item 3;
// Porcupine's balancing applied to user managers): a node whose load
// monitor (internal/load, ADR 0032) reports it overloaded without a break
// for ShedAfter lowers its own weight in membership one step (halving it,
// down to a quarter of membership.DefaultWeight), so that the next map
// epoch gives some of its buckets to the other nodes; once it has not
// been overloaded for RestoreAfter, it raises its weight one step again.
// Each step waits for its own period anew, so a node sheds at most a step
// per ShedAfter and recovers at most a step per RestoreAfter, and a load
// that comes and goes does not move buckets back and forth.
const (
	ShedAfter    = 10 * time.Second
	RestoreAfter = time.Minute
	// minWeight is the lowest weight load brings a node to: it keeps a
	// share, so that its sessions' users are still partly local.
	minWeight = membership.DefaultWeight / 4
)

// balancer decides the weight from the overload signal's history.
type balancer struct {
	weight uint32    // current
	since  time.Time // when the signal last changed, or a step was taken
	over   bool      // the signal at since
}

// step takes the signal at now and returns the weight to advertise.
func (b *balancer) step(overloaded bool, now time.Time) uint32 {
	if b.since.IsZero() || overloaded != b.over {
		b.since, b.over = now, overloaded
		return b.weight
	}
	held := now.Sub(b.since)
	switch {
	case overloaded && held >= ShedAfter && b.weight > minWeight:
		b.weight = max(b.weight/2, minWeight)
		b.since = now
	case !overloaded && held >= RestoreAfter && b.weight < membership.DefaultWeight:
		b.weight = min(b.weight*2, membership.DefaultWeight)
		b.since = now
	}
	return b.weight
}

// balance runs the balancer every second until stop is closed, setting
// the membership weight whenever it changes.
func (n *Node) balance(stop <-chan struct{}) {
	defer close(n.balanceDone)
	mem := n.mem.Load()
	b := &balancer{weight: mem.Weight()}
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		select {
		case <-stop:
			return
		case now := <-tick.C:
			w := b.step(n.load.Overloaded(), now)
			if w == mem.Weight() {
				continue
			}
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			err := mem.SetWeight(ctx, w)
			cancel()
			if err != nil {
				n.log.Warn("cluster: announcing a new weight", "weight", w, "err", err)
				continue
			}
			n.log.Warn("cluster: weight changed with load; the next map epoch moves buckets", "weight", w, "overloaded", b.over)
		}
	}
}
