package delivery

import (
	"bytes"
	"errors"
	"io"
	"testing"
	"time"
)

// The oldest body in flight never waits, even past the limit; a younger
// one waits for room and fails with ErrBusy when none comes in time.
func TestBudgetOldestProceedsYoungerTimesOut(t *testing.T) {
	b := NewBudget(100, 50*time.Millisecond)
	old, young := b.Hold(), b.Hold()
	defer old.Release()
	defer young.Release()
	if _, err := io.Copy(io.Discard, old.Reader(bytes.NewReader(make([]byte, 80)))); err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(io.Discard, young.Reader(bytes.NewReader(make([]byte, 30)))); !errors.Is(err, ErrBusy) {
		t.Fatalf("younger body over the budget: %v, want ErrBusy", err)
	}
	if _, err := io.Copy(io.Discard, old.Reader(bytes.NewReader(make([]byte, 500)))); err != nil {
		t.Fatalf("oldest body past the limit: %v", err)
	}
}

// A body waiting for room proceeds when another is released.
func TestBudgetReleaseWakesWaiter(t *testing.T) {
	b := NewBudget(100, time.Minute)
	old, young := b.Hold(), b.Hold()
	if _, err := io.Copy(io.Discard, old.Reader(bytes.NewReader(make([]byte, 90)))); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		_, err := io.Copy(io.Discard, young.Reader(bytes.NewReader(make([]byte, 50))))
		young.Release()
		done <- err
	}()
	old.Release()
	if err := <-done; err != nil {
		t.Fatalf("waiting body after a release: %v", err)
	}
	if b.mu.used != 0 || b.mu.order.Len() != 0 {
		t.Fatalf("after every release: used %d, %d holds", b.mu.used, b.mu.order.Len())
	}
}

// A nil Budget bounds nothing.
func TestNilBudget(t *testing.T) {
	var b *Budget
	h := b.Hold()
	if n, err := io.Copy(io.Discard, h.Reader(bytes.NewReader(make([]byte, 1000)))); n != 1000 || err != nil {
		t.Fatalf("%d, %v", n, err)
	}
	h.Release()
}
