package cassandra

import (
	"context"
	"errors"
	"testing"
	"time"

	"quill/internal/store"
)

// TestSettle: applying a committed operation (and learning an LWT's
// outcome) is retried for a bounded time, not a bounded count: failures
// for a second, as while the driver finds the coordinator dead, are
// ridden out; the caller's deadline or a final error ends it sooner. What
// is then reported is of unknown outcome, never a refusal.
func TestSettle(t *testing.T) {
	ctx := context.Background()
	errDown := errors.New("coordinator down")
	start := time.Now()
	tries := 0
	err := settle(ctx, start, nil, func() error {
		tries++
		if time.Since(start) < time.Second {
			return errDown
		}
		return nil
	})
	if err != nil || tries < 5 {
		t.Fatalf("settle over a second of failures = %v after %d tries, want success", err, tries)
	}
	t.Logf("%d tries in %v", tries, time.Since(start))

	dctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel()
	start = time.Now()
	err = settle(dctx, start, nil, func() error { return errDown })
	if !errors.Is(err, errDown) || time.Since(start) > 2*time.Second {
		t.Fatalf("settle past the caller's deadline = %v after %v, want errDown at the deadline", err, time.Since(start))
	}

	tries = 0
	err = settle(ctx, time.Now(), isNotFound, func() error { tries++; return store.ErrNotFound })
	if !errors.Is(err, store.ErrNotFound) || tries != 1 {
		t.Fatalf("settle with a final error = %v after %d tries, want ErrNotFound after 1", err, tries)
	}

	// Begun settleFor ago: one try, then give up.
	tries = 0
	err = settle(ctx, time.Now().Add(-settleFor), nil, func() error { tries++; return errDown })
	if !errors.Is(err, errDown) || tries != 1 {
		t.Fatalf("settle past settleFor = %v after %d tries, want errDown after 1", err, tries)
	}

	if !errors.Is(errAmbiguous, store.ErrOutcomeUnknown) || errors.Is(errAmbiguous, store.ErrUnavailable) {
		t.Fatalf("errAmbiguous = %v: must be store.ErrOutcomeUnknown and not store.ErrUnavailable", errAmbiguous)
	}
}
