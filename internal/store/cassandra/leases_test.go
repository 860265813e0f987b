package cassandra

import (
	"context"
	"errors"
	"testing"
	"time"

	"quill/internal/store"
)

// openLeaseTest opens an engine on ks with a short maildrop lease term; two
// of them stand for two Quill processes.
func openLeaseTest(t *testing.T, ks string, term time.Duration) *Engine {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	o := testOptions(ks)
	o.MaildropLease = term
	e, err := Open(ctx, o)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	t.Cleanup(func() { e.Close() })
	return e
}

// TestMaildropLeaseRenewedAndReleased: a held lease outlives several terms
// because its holder renews it, another process cannot take it meanwhile,
// and takes it at once after Release.
func TestMaildropLeaseRenewedAndReleased(t *testing.T) {
	const term = 3 * time.Second
	ks := newKeyspace(t)
	a, b := openLeaseTest(t, ks, term), openLeaseTest(t, ks, term)
	ctx := context.Background()
	held, err := a.LockMaildrop(ctx, "u@example.test")
	if err != nil {
		t.Fatal(err)
	}
	// The property is about time: the lease must still be A's after three
	// terms, which only its renewals can achieve.
	for start := time.Now(); time.Since(start) < 3*term; {
		if _, err := b.LockMaildrop(ctx, "u@example.test"); !errors.Is(err, store.ErrInUse) {
			t.Fatalf("after %v: other process's LockMaildrop: %v, want ErrInUse", time.Since(start).Round(time.Millisecond), err)
		}
		if err := held.Held(); err != nil {
			t.Fatalf("after %v: Held: %v", time.Since(start).Round(time.Millisecond), err)
		}
		time.Sleep(term / 4)
	}
	if err := held.Release(ctx); err != nil {
		t.Fatal(err)
	}
	l, err := b.LockMaildrop(ctx, "u@example.test")
	if err != nil {
		t.Fatalf("LockMaildrop after the holder's Release: %v", err)
	}
	l.Release(ctx)
}

// TestMaildropLeaseExpiresWithItsHolder: a holder that stops renewing (its
// process died: here its engine closes without releasing) blocks others
// for at most one term.
func TestMaildropLeaseExpiresWithItsHolder(t *testing.T) {
	const term = 3 * time.Second
	ks := newKeyspace(t)
	a, b := openLeaseTest(t, ks, term), openLeaseTest(t, ks, term)
	ctx := context.Background()
	taken := time.Now()
	if _, err := a.LockMaildrop(ctx, "u@example.test"); err != nil {
		t.Fatal(err)
	}
	a.Close()
	if _, err := b.LockMaildrop(ctx, "u@example.test"); !errors.Is(err, store.ErrInUse) {
		t.Fatalf("LockMaildrop right after the holder died: %v, want ErrInUse", err)
	}
	deadline := taken.Add(term + 10*time.Second) // TTL, plus slack for a loaded cluster
	for {
		l, err := b.LockMaildrop(ctx, "u@example.test")
		if err == nil {
			if since := time.Since(taken); since < term-time.Second {
				t.Fatalf("lease taken over %v after it was taken, before its %v term", since, term)
			}
			l.Release(ctx)
			return
		}
		if !errors.Is(err, store.ErrInUse) {
			t.Fatal(err)
		}
		if time.Now().After(deadline) {
			t.Fatalf("lease of a dead holder still live %v after it was taken (term %v)", time.Since(taken), term)
		}
		time.Sleep(200 * time.Millisecond)
	}
}
