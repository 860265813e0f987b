package cassandra

import (
	"errors"
	"runtime"
	"sync/atomic"
	"testing"
)

// TestRunAll: every call runs once, at once (each waits for all the others
// to have started), the errors are joined, and the runners are reused: a
// thousand rounds leave at most maxIdleRunners of them waiting.
func TestRunAll(t *testing.T) {
	before := runtime.NumGoroutine()
	boom := errors.New("boom")
	for round := range 1000 {
		const n = 5
		var started, ran atomic.Int32
		all := make(chan struct{})
		err := runAll(n, func(i int) error {
			if started.Add(1) == n {
				close(all)
			}
			<-all
			ran.Add(1)
			if i == round%n {
				return boom
			}
			return nil
		})
		if ran.Load() != n || !errors.Is(err, boom) {
			t.Fatalf("round %d: %d calls ran, err %v", round, ran.Load(), err)
		}
	}
	if err := runAll(3, func(int) error { return nil }); err != nil {
		t.Fatal(err)
	}
	if got := runtime.NumGoroutine() - before; got > maxIdleRunners {
		t.Errorf("%d more goroutines after the rounds; want at most %d waiting runners", got, maxIdleRunners)
	}
	if idle := runners.idle.Load(); idle < 1 || idle > maxIdleRunners {
		t.Errorf("%d idle runners, want 1 to %d", idle, maxIdleRunners)
	}
}
