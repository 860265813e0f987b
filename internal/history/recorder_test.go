package history

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"
)

func TestRecorder(t *testing.T) {
	r := NewRecorder()
	var wg sync.WaitGroup
	for p := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 25 {
				op := r.Begin(p, "n1", Deliver)
				r.End(op, Ok, nil)
				rd := r.Begin(p, "n1", Read)
				r.End(rd, Ok, nil) // reads are not counted as acknowledged writes
			}
		}()
	}
	if err := r.WaitAcked(t.Context(), 100, time.Minute); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	if got := r.Acked(); got != 100 {
		t.Errorf("Acked = %d, want 100", got)
	}
	pending := r.Begin(9, "n2", Store)
	err := r.WaitAcked(t.Context(), 101, 50*time.Millisecond)
	if !errors.Is(err, ErrStalled) {
		t.Errorf("WaitAcked past the count: %v, want ErrStalled", err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	if err := r.WaitAcked(ctx, 101, time.Minute); !errors.Is(err, context.Canceled) {
		t.Errorf("WaitAcked on a cancelled context: %v", err)
	}
	ops := r.Ops()
	if len(ops) != 201 {
		t.Fatalf("%d ops, want 201", len(ops))
	}
	last := ops[pending.Index]
	if last.Outcome != Ambiguous || last.Complete < last.Invoke {
		t.Errorf("an op without End is returned as %v (%d..%d), want ambiguous", last.Outcome, last.Invoke, last.Complete)
	}
	for i, op := range ops {
		if op.Index != i {
			t.Fatalf("op %d has index %d", i, op.Index)
		}
	}
}
