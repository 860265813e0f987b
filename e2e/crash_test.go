package e2e

import (
	"context"
	"flag"
	"fmt"
	"math/rand/v2"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"quill/internal/loadgen"
)

// The crash tests prove the delivery contract "250 means durable": SIGKILL
// the server while many SMTP transactions are in flight, restart it on the
// same data directory, and check with POP3 that every acknowledged message
// is stored exactly once and byte-exact, that nothing stored is corrupt, and
// that the store's own consistency check passes after a clean stop.
//
// The kill is triggered by the count of acknowledgements the client has
// received, never by a timer; the count is drawn from a seed that the test
// logs, and -crash.seed replays it. -short lowers the upper kill point.

var crashSeed = flag.Uint64("crash.seed", 0, "seed for the crash tests' kill points and messages (0: from the clock)")

// crashParams describe one family of crash runs.
type crashParams struct {
	size        int // message size in octets
	concurrency int // SMTP connections
	users       int
	// The kill comes after a number of acknowledgements drawn uniformly
	// from [minAcks, maxAcks].
	minAcks, maxAcks int
}

func TestCrashKill9(t *testing.T) {
	crashRuns(t, crashParams{size: 4700, concurrency: 16, users: 4, minAcks: 200, maxAcks: 2000})
}

// TestCrashKill9LargeMessages uses 300 KB messages so that the kill
// commonly lands while a body is on the wire or being written.
func TestCrashKill9LargeMessages(t *testing.T) {
	crashRuns(t, crashParams{size: 300 << 10, concurrency: 8, users: 3, minAcks: 20, maxAcks: 120})
}

const crashRunsPerTest = 3

func crashRuns(t *testing.T, p crashParams) {
	seed := *crashSeed
	if seed == 0 {
		seed = uint64(time.Now().UnixNano())
	}
	t.Logf("crash seed %d (replay with -crash.seed=%d)", seed, seed)
	if testing.Short() {
		p.maxAcks = max(p.minAcks, p.maxAcks/4)
	}
	rng := rand.New(rand.NewPCG(seed, 0))
	for i := range crashRunsPerTest {
		killAfter := p.minAcks + rng.IntN(p.maxAcks-p.minAcks+1)
		runSeed := rng.Uint64()
		t.Run(fmt.Sprintf("run%d", i), func(t *testing.T) { crashRun(t, p, runSeed, killAfter) })
	}
}

// crashRun is one start / load / SIGKILL / restart / verify / check cycle
// on a fresh server.
func crashRun(t *testing.T, p crashParams, seed uint64, killAfter int) {
	s := startServer(t, Options{})
	users := loadgen.UserNames(s.Domain, p.users)
	passwords := make(map[string]string, len(users))
	for i, u := range users {
		passwords[u] = "crash-pw-" + strconv.Itoa(i)
		addUser(t, s, u, passwords[u])
	}

	// The load runs until cancelled; Count only bounds a run in which the
	// kill point is never reached (every message refused, say), so that the
	// test fails instead of hanging.
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	var ledger loadgen.Ledger
	var acks atomic.Int64
	killNow := make(chan struct{})
	var once sync.Once
	cfg := loadgen.Config{
		Addr: s.Addr("smtp"),
		Spec: loadgen.Spec{
			Seed:  seed,
			RunID: "crash-" + strconv.FormatUint(seed, 36),
			From:  "loadgen@quill-load.invalid",
			Sizes: loadgen.FixedSize(p.size),
			Rcpts: loadgen.Uniform{Users: users},
		},
		Concurrency: p.concurrency,
		Count:       int64(4*killAfter + 100),
		Timeout:     2 * time.Minute,
		OnRecord: func(r *loadgen.Record) {
			ledger.Add(r)
			if r.Outcome == loadgen.Acked && acks.Add(1) == int64(killAfter) {
				once.Do(func() { close(killNow) })
			}
		},
	}
	type runResult struct {
		sum loadgen.Summary
		err error
	}
	done := make(chan runResult, 1)
	go func() {
		sum, err := loadgen.Run(ctx, cfg)
		done <- runResult{sum, err}
	}()

	var res runResult
	select {
	case <-killNow:
		// The workers keep sending while the process dies: the kill lands
		// in the middle of whatever transactions are in flight.
		s.Kill()
		cancel()
		res = <-done
	case res = <-done:
		t.Fatalf("load ended after %d acknowledgements, before the kill point %d: %v; summary %+v",
			acks.Load(), killAfter, res.err, res.sum)
	}
	records := ledger.Records()
	stages := map[loadgen.Stage]int{}
	for _, r := range records {
		if r.Outcome == loadgen.NoReply {
			stages[r.Stage]++
		}
	}
	t.Logf("killed after %d acks (target %d): attempted %d, rejected %d (%v), no reply %d by stage %v",
		res.sum.Acked, killAfter, res.sum.Attempted, res.sum.Rejected, res.sum.RejectCodes, res.sum.NoReply, stages)

	s.Restart(t)
	rep, err := loadgen.VerifyPOP3(t.Context(), records, loadgen.POP3Options{Addr: s.Addr("pop3"), Timeout: time.Minute}, passwords)
	if err != nil {
		t.Fatalf("retrieving mailboxes after restart: %v", err)
	}
	t.Logf("after restart: acknowledged %d, present %d, lost %d, duplicates %d, corrupt %d, unacknowledged present %d, foreign %d",
		rep.Acked, rep.Present, len(rep.Missing), len(rep.Duplicated), len(rep.Corrupt), rep.UnackedPresent, rep.Foreign)
	if rep.Acked < killAfter {
		t.Errorf("only %d acknowledged pairs verified, want at least %d", rep.Acked, killAfter)
	}
	if !rep.OK() || rep.Foreign != 0 {
		t.Errorf("durability violated: %s\nmissing: %s\nduplicated: %s\ncorrupt: %s",
			rep.String(), head(rep.Missing), head(rep.Duplicated), head(rep.Corrupt))
	}

	s.Stop(t)
	if out, err := Quill(t, "", "check", "--data", s.DataDir); err != nil {
		t.Errorf("quill check after crash, restart and clean stop: %v\n%s", err, out)
	}
}

// head returns the first few items of a long list for a failure message.
func head(items []string) string {
	const n = 20
	if len(items) <= n {
		return fmt.Sprint(items)
	}
	return fmt.Sprintf("%v ... (%d more)", items[:n], len(items)-n)
}
