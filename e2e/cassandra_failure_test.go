package e2e

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"quill/internal/loadgen"
)

// TestCassandraFailures is the failure test of the Cassandra engine (issue
// 5, item 6): three quill serve processes on a three-node Cassandra (RF 3,
// QUORUM reads and writes) under continuous SMTP delivery through all three
// listeners, while
//
//  1. one Cassandra node is killed with SIGKILL,
//  2. later restarted (scripts/cassandra restart waits until it serves),
//  3. one Quill node is killed with SIGKILL and not restarted.
//
// Every step is triggered by the number of acknowledgements the clients
// have received since the previous one, never by a timer. Deliveries must
// continue on the survivors after every step (the next step's count is
// reached within stepTimeout), and afterwards POP3 through a surviving node
// must show every acknowledged (message, recipient) pair exactly once and
// byte-exact. The test logs, for every step, how long the clients saw
// errors: the first and last failed transaction after it, from the records.
//
// It needs a 3-node cluster: QUILL_CASSANDRA_NODES=3 (scripts/test runs it
// in its 3-node step, on the cluster it shares with the engine's tests).
func TestCassandraFailures(t *testing.T) {
	if os.Getenv("QUILL_CASSANDRA_NODES") != "3" {
		t.Skip("needs a 3-node cluster: QUILL_CASSANDRA_NODES=3 (scripts/test runs it in its 3-node step)")
	}
	c := useCassandra(t)
	cfg := c.config(t, fmt.Sprintf("failure_%d", os.Getpid()), `read_consistency = "QUORUM"
write_consistency = "QUORUM"
serial_consistency = "SERIAL"
`)
	// The restarted node starts its JVM on two cores shared with three
	// race-instrumented Quill servers under load: about 35 s on an idle
	// machine. Under the load of each connection sending back to back,
	// or paced at 10 messages a second per Quill node, the cold node fell
	// behind the writes and hints sent to it, dropped them as they timed
	// out (messages 5.9 s late) and served a CL ALL read only after 4.5
	// to 7.5 minutes, once more than 8 in CI. Hence perNodeRate. This
	// test is about Quill, so a slow restart must not fail it (the time
	// it took is logged).
	const restartWithin = 8 * time.Minute
	// A Cassandra node left dead (or still starting) by a failed run would
	// break the next test sharing the cluster: bring it back whatever
	// happened, within a bound that keeps the package inside its go test
	// timeout. This cleanup runs after the Quill servers' (registered
	// later), so on failure the cluster's log tails come last.
	var cassDown sync.Mutex
	downNode := ""
	t.Cleanup(func() {
		cassDown.Lock()
		defer cassDown.Unlock()
		if t.Failed() {
			logs, _ := exec.Command(c.script, "logs", c.dir).CombinedOutput()
			t.Logf("cassandra logs:\n%s", logs)
		}
		if downNode != "" {
			if err := c.restart(t, downNode, 2*time.Minute); err != nil {
				t.Errorf("restarting cassandra node %s after the test: %v", downNode, err)
			}
		}
	})

	var servers []*Server
	for range 3 {
		servers = append(servers, startServer(t, Options{ConfigFile: cfg}))
	}
	users := loadgen.UserNames(DefaultDomain, 6)
	passwords := make(map[string]string, len(users))
	for i, u := range users {
		passwords[u] = "failure-pw-" + strconv.Itoa(i)
		addUser(t, servers[0], u, passwords[u])
	}

	const (
		warmup      = 60 // acknowledgements before the first kill
		perStep     = 60 // acknowledgements between steps
		stepTimeout = 2 * time.Minute
		perNode     = 3 // SMTP connections per Quill node
		// Messages a second through each Quill node: deliveries in
		// flight at every step, slow enough for a restarted Cassandra
		// node to catch up (restartWithin).
		perNodeRate = 3
	)
	rec := newFailureLedger()
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	runs := make([]chan error, len(servers))
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	for i, s := range servers {
		runs[i] = make(chan error, 1)
		cfg := loadgen.Config{
			Addr: s.Addr("smtp"),
			Spec: loadgen.Spec{
				Seed:  seed + uint64(i),
				RunID: fmt.Sprintf("failure-n%d-%s", i, strconv.FormatUint(seed, 36)),
				From:  "loadgen@quill-load.invalid",
				Sizes: loadgen.UniformSize{Min: 600, Max: 24 << 10},
				Rcpts: someOf{users: users, max: 3},
			},
			Concurrency: perNode,
			Rate:        perNodeRate,
			Timeout:     time.Minute,
			OnRecord:    func(r *loadgen.Record) { rec.add(i, r) },
		}
		go func() {
			_, err := loadgen.Run(ctx, cfg)
			runs[i] <- err
		}()
	}

	// step waits until the survivors have acknowledged n more messages
	// since the previous step and then records the event.
	var events []failureEvent
	all := []int{0, 1, 2}
	step := func(name string, n int, survivors []int, action func()) {
		t.Helper()
		target := rec.acks(survivors) + n
		if err := rec.waitAcks(ctx, survivors, target, stepTimeout); err != nil {
			t.Fatalf("before %s: %v", name, err)
		}
		at := time.Now()
		action()
		events = append(events, failureEvent{name: name, at: at, done: time.Now()})
		t.Logf("%s at %d acknowledgements (took %v)", name, rec.acks(all), time.Since(at).Round(time.Millisecond))
	}
	step("kill -9 cassandra node 1", warmup, all, func() {
		cassDown.Lock()
		defer cassDown.Unlock()
		if err := c.run(t, "kill", "1"); err != nil {
			t.Fatal(err)
		}
		downNode = "1"
	})
	step("restart cassandra node 1", perStep, all, func() {
		cassDown.Lock()
		defer cassDown.Unlock()
		if err := c.restart(t, "1", restartWithin); err != nil {
			t.Fatal(err)
		}
		downNode = ""
	})
	step("kill -9 quill node 2", perStep, all, func() { servers[2].Kill() })
	step("end of load", perStep, []int{0, 1}, cancel)

	for i, ch := range runs {
		if err := <-ch; err != nil && !(i == 2 && errors.Is(err, loadgen.ErrAllWorkersFailed)) {
			t.Errorf("load through quill node %d: %v", i, err)
		}
	}
	records := rec.all()
	failed := reportErrorWindows(t, records, events)
	// What each Quill node's driver made of the restart (hosts.go).
	for i, s := range servers {
		for _, line := range strings.Split(s.Log(), "\n") {
			if strings.Contains(line, "cassandra host") {
				t.Logf("quill node %d: %s", i, strings.TrimSpace(line))
			}
		}
	}
	// With RF 3 at QUORUM a restarting replica leaves a quorum of two
	// others, so its restart must be invisible: the driver must neither
	// route requests to it before it serves them nor fail what it could
	// retry elsewhere (engine.go, session).
	if n := failed["restart cassandra node 1"]; n != 0 {
		t.Errorf("restart of cassandra node 1: %d failed transactions, want 0", n)
	}

	// loadgen.VerifyPOP3, plus a report of what any foreign message is.
	v := loadgen.NewVerifier(rec.records())
	known := map[string]bool{}
	for _, r := range rec.records() {
		known[r.ID] = true
	}
	for _, u := range users {
		o := loadgen.POP3Options{Addr: servers[0].Addr("pop3"), User: u, Password: passwords[u], Timeout: time.Minute}
		err := loadgen.FetchPOP3(t.Context(), o, func(n int, msg []byte) error {
			v.Observe(u, msg)
			if id, ok := loadgen.HeaderValue(loadgen.StripTrace(msg), loadgen.IDHeader); !ok || !known[id] {
				t.Errorf("foreign message %d in %s (id %q): %.400q", n, u, id, msg)
			}
			return nil
		})
		if err != nil {
			t.Fatalf("retrieving %s through quill node 0: %v", u, err)
		}
	}
	rep := v.Report()
	t.Logf("verified through quill node 0: acknowledged pairs %d, present %d, lost %d, duplicated %d, corrupt %d, unacknowledged present %d, foreign %d",
		rep.Acked, rep.Present, len(rep.Missing), len(rep.Duplicated), len(rep.Corrupt), rep.UnackedPresent, rep.Foreign)
	if rep.Acked < warmup+3*perStep {
		t.Errorf("only %d acknowledged pairs, want at least %d", rep.Acked, warmup+3*perStep)
	}
	if !rep.OK() || rep.Foreign != 0 {
		t.Errorf("acknowledged mail lost, duplicated or corrupt: %s\nmissing: %s\nduplicated: %s\ncorrupt: %s",
			rep.String(), head(rep.Missing), head(rep.Duplicated), head(rep.Corrupt))
	}
}

// someOf picks 1 to max distinct recipients uniformly, so that deliveries
// share one blob between several mailboxes.
type someOf struct {
	users []string
	max   int
}

func (s someOf) Pick(r *rand.Rand, dst []string) []string {
	n := 1 + r.IntN(s.max)
	for _, i := range r.Perm(len(s.users))[:n] {
		dst = append(dst, s.users[i])
	}
	return dst
}

// failureEvent is one injected failure: at is when it began, done when the
// action returned (a restart returns once the node serves).
type failureEvent struct {
	name     string
	at, done time.Time
}

// timedRecord is a loadgen record with the Quill node it was sent to and
// the time its outcome was known.
type timedRecord struct {
	node int
	at   time.Time
	r    *loadgen.Record
}

// failureLedger collects the records of all nodes' load and lets the test
// goroutine wait for acknowledgement counts.
type failureLedger struct {
	mu struct {
		sync.Mutex
		recs   []timedRecord
		acked  map[int]int
		notify chan struct{} // closed and replaced on every acknowledgement
	}
}

func newFailureLedger() *failureLedger {
	l := &failureLedger{}
	l.mu.acked = map[int]int{}
	l.mu.notify = make(chan struct{})
	return l
}

func (l *failureLedger) add(node int, r *loadgen.Record) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.mu.recs = append(l.mu.recs, timedRecord{node: node, at: time.Now(), r: r})
	if r.Outcome == loadgen.Acked {
		l.mu.acked[node]++
		close(l.mu.notify)
		l.mu.notify = make(chan struct{})
	}
}

func (l *failureLedger) acks(nodes []int) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, i := range nodes {
		n += l.mu.acked[i]
	}
	return n
}

// waitAcks waits until the given nodes together have acknowledged n
// messages; it fails after timeout.
func (l *failureLedger) waitAcks(ctx context.Context, nodes []int, n int, timeout time.Duration) error {
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	for {
		l.mu.Lock()
		got, ch := 0, l.mu.notify
		for _, i := range nodes {
			got += l.mu.acked[i]
		}
		l.mu.Unlock()
		if got >= n {
			return nil
		}
		select {
		case <-ch:
		case <-deadline.C:
			return fmt.Errorf("deliveries stalled: nodes %v acknowledged %d of %d within %v", nodes, got, n, timeout)
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

func (l *failureLedger) all() []timedRecord {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]timedRecord(nil), l.mu.recs...)
}

func (l *failureLedger) records() []*loadgen.Record {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := make([]*loadgen.Record, len(l.mu.recs))
	for i, tr := range l.mu.recs {
		out[i] = tr.r
	}
	return out
}

// reportErrorWindows logs, for every event, the failed transactions the
// clients saw until the next event: how many, on which nodes, and the first
// and last of them relative to the event. The last event ends the load;
// transactions it cut short are not errors. It returns the number of failed
// transactions per event name.
func reportErrorWindows(t *testing.T, records []timedRecord, events []failureEvent) map[string]int {
	t.Helper()
	failed := map[string]int{}
	for i, ev := range events[:len(events)-1] {
		end := events[i+1].at
		var first, last time.Time
		count := map[int]int{}
		codes := map[string]int{}
		acked := 0
		for _, tr := range records {
			if tr.at.Before(ev.at) || !tr.at.Before(end) {
				continue
			}
			if tr.r.Outcome == loadgen.Acked {
				acked++
				continue
			}
			if first.IsZero() || tr.at.Before(first) {
				first = tr.at
			}
			if tr.at.After(last) {
				last = tr.at
			}
			count[tr.node]++
			failed[ev.name]++
			if tr.r.Outcome == loadgen.Rejected {
				codes[strconv.Itoa(tr.r.Code)]++
			} else {
				codes["no reply"]++
			}
		}
		if first.IsZero() {
			t.Logf("%s: no client errors in the next %v (%d acknowledged)", ev.name, end.Sub(ev.at).Round(time.Millisecond), acked)
			continue
		}
		t.Logf("%s: client errors from +%v to +%v after it (window %v; action took %v), by node %v, by reply %v; %d acknowledged until the next step",
			ev.name, first.Sub(ev.at).Round(time.Millisecond), last.Sub(ev.at).Round(time.Millisecond),
			last.Sub(first).Round(time.Millisecond), ev.done.Sub(ev.at).Round(time.Millisecond), count, codes, acked)
	}
	return failed
}
