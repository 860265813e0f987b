package cassandra

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"

	gocql "github.com/apache/cassandra-gocql-driver/v2"
)

// A Cassandra node that restarts opens its CQL port, and the driver marks
// it up and routes requests to it (token-aware: it is a replica of a third
// of the ring at RF 3), before it serves them as a coordinator: its peers
// and its Paxos state are not settled yet, and requests it coordinates time
// out ("received only 1 responses") while two other replicas could answer.
// Two measures make such a restart invisible at QUORUM (docs/cassandra.md,
// "Failures"):
//
//   - warmupPolicy puts a host that came back last in every query plan
//     until it has coordinated warmupProbes serial reads in a row, each
//     within probeTimeout;
//   - retryPolicy retries on the next host what may be retried: any error
//     of an idempotent statement (reads, and writes keyed and valued
//     deterministically), and of an LWT only the errors by which the
//     coordinator says it did not start it (Unavailable, Overloaded,
//     Bootstrapping). An LWT whose outcome is unknown is returned to the
//     caller, which resolves it by a serial read (ops.go, resolve).

const (
	// warmupProbes serial reads in a row, warmupEvery apart, each answered
	// within probeTimeout, make a host that came back a first choice again.
	warmupProbes = 5
	warmupEvery  = time.Second
	probeTimeout = time.Second
	// retries is how many times a statement is retried on another host.
	retries = 2
)

// retryPolicy is the engine's gocql.RetryPolicy. The driver consults it
// only for statements marked idempotent; an LWT is marked idempotent only
// with lwt set, which restricts retries to errors that prove it unapplied.
type retryPolicy struct {
	lwt bool
}

var (
	retryIdempotent = &retryPolicy{}
	retryLWT        = &retryPolicy{lwt: true}
)

// Attempt implements gocql.RetryPolicy.
func (p *retryPolicy) Attempt(q gocql.RetryableQuery) bool { return q.Attempts() <= retries }

// GetRetryType implements gocql.RetryPolicy.
func (p *retryPolicy) GetRetryType(err error) gocql.RetryType {
	var re gocql.RequestError
	if !errors.As(err, &re) {
		// No reply: the connection failed or timed out, so the statement
		// may have been applied.
		if p.lwt {
			return gocql.Rethrow
		}
		return gocql.RetryNextHost
	}
	switch re.Code() {
	case gocql.ErrCodeUnavailable, gocql.ErrCodeOverloaded, gocql.ErrCodeBootstrapping:
		// The coordinator refused the statement before acting on it.
		return gocql.RetryNextHost
	case gocql.ErrCodeServer, gocql.ErrCodeWriteTimeout, gocql.ErrCodeReadTimeout,
		gocql.ErrCodeReadFailure, gocql.ErrCodeWriteFailure, gocql.ErrCodeCASWriteUnknown:
		if p.lwt {
			return gocql.Rethrow
		}
		return gocql.RetryNextHost
	default:
		// The statement itself is wrong (syntax, invalid, unauthorized):
		// another host would say the same.
		return gocql.Rethrow
	}
}

// warmupPolicy wraps a HostSelectionPolicy: a host seen down that comes
// back up is "cold", and every query plan yields cold hosts only after all
// others, until probe has succeeded warmupProbes times in a row on it.
// Hosts up when the session starts are not cold. Plans stay complete, so a
// cluster whose every host is cold is still used.
type warmupPolicy struct {
	gocql.HostSelectionPolicy
	log *slog.Logger

	mu struct {
		sync.Mutex
		probe    func(ctx context.Context, hostID string) error // nil until the session exists
		seenDown map[string]bool                                // host IDs that went down
		cold     map[string]bool                                // host IDs being probed
		again    map[string]bool                                // cold host IDs that went down and up again meanwhile
		closed   bool
	}
	stop chan struct{}
	wg   sync.WaitGroup
}

func newWarmupPolicy(inner gocql.HostSelectionPolicy, log *slog.Logger) *warmupPolicy {
	p := &warmupPolicy{HostSelectionPolicy: inner, log: log, stop: make(chan struct{})}
	p.mu.seenDown = map[string]bool{}
	p.mu.cold = map[string]bool{}
	p.mu.again = map[string]bool{}
	return p
}

// setProbe installs the readiness probe once the session exists; hosts
// that came back before it wait for it.
func (p *warmupPolicy) setProbe(probe func(ctx context.Context, hostID string) error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.mu.probe = probe
}

// close stops the probes; the session is closed after it.
func (p *warmupPolicy) close() {
	p.mu.Lock()
	p.mu.closed = true
	p.mu.Unlock()
	close(p.stop)
	p.wg.Wait()
}

// HostDown implements gocql.HostSelectionPolicy.
func (p *warmupPolicy) HostDown(h *gocql.HostInfo) {
	p.mu.Lock()
	p.mu.seenDown[h.HostID()] = true
	p.mu.Unlock()
	p.HostSelectionPolicy.HostDown(h)
}

// RemoveHost implements gocql.HostSelectionPolicy.
func (p *warmupPolicy) RemoveHost(h *gocql.HostInfo) {
	p.mu.Lock()
	p.mu.seenDown[h.HostID()] = true
	p.mu.Unlock()
	p.HostSelectionPolicy.RemoveHost(h)
}

// HostUp implements gocql.HostSelectionPolicy.
func (p *warmupPolicy) HostUp(h *gocql.HostInfo) {
	p.markCold(h)
	p.HostSelectionPolicy.HostUp(h)
}

// AddHost implements gocql.HostSelectionPolicy (the driver adds a host
// back when it reconnects to it).
func (p *warmupPolicy) AddHost(h *gocql.HostInfo) {
	p.markCold(h)
	p.HostSelectionPolicy.AddHost(h)
}

// markCold starts probing h if it went down before and is not probed yet.
func (p *warmupPolicy) markCold(h *gocql.HostInfo) {
	id := h.HostID()
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.mu.seenDown[id] || p.mu.closed {
		return
	}
	delete(p.mu.seenDown, id)
	if p.mu.cold[id] {
		p.mu.again[id] = true // its prober starts counting again
		return
	}
	p.mu.cold[id] = true
	p.log.Info("cassandra host back: used last until it answers probes", "host", h.ConnectAddress(), "host_id", id)
	p.wg.Add(1)
	go p.warm(id, h.ConnectAddress().String())
}

// warm probes a cold host until it has answered warmupProbes in a row (a
// host down fails its probes) or the policy closes.
func (p *warmupPolicy) warm(id, addr string) {
	defer p.wg.Done()
	tick := time.NewTicker(warmupEvery)
	defer tick.Stop()
	start, ok := time.Now(), 0
	for ok < warmupProbes {
		select {
		case <-p.stop:
			return
		case <-tick.C:
		}
		p.mu.Lock()
		probe, again := p.mu.probe, p.mu.again[id]
		delete(p.mu.again, id)
		p.mu.Unlock()
		if again {
			ok = 0
		}
		if probe == nil {
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), probeTimeout)
		err := probe(ctx, id)
		cancel()
		if err != nil {
			ok = 0
			p.log.Debug("cassandra host not ready yet", "host", addr, "err", err)
			continue
		}
		ok++
	}
	p.mu.Lock()
	delete(p.mu.cold, id)
	p.mu.Unlock()
	p.log.Info("cassandra host ready again", "host", addr, "after", time.Since(start).Round(time.Millisecond))
}

func (p *warmupPolicy) isCold(h *gocql.HostInfo) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.mu.cold[h.HostID()]
}

// Pick implements gocql.HostSelectionPolicy: the inner plan with cold
// hosts moved to its end.
func (p *warmupPolicy) Pick(stmt gocql.ExecutableStatement) gocql.NextHost {
	next := p.HostSelectionPolicy.Pick(stmt)
	var deferred []gocql.SelectedHost
	done := false
	return func() gocql.SelectedHost {
		for !done {
			h := next()
			if h == nil {
				done = true
				break
			}
			if p.isCold(h.Info()) {
				deferred = append(deferred, h)
				continue
			}
			return h
		}
		if len(deferred) == 0 {
			return nil
		}
		h := deferred[0]
		deferred = deferred[1:]
		return h
	}
}
