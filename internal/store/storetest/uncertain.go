package storetest

import (
	"context"
	"fmt"
	"sync/atomic"

	"quill/internal/store"
)

// Uncertain is a fault injector for the layers above an engine: it wraps
// a real engine that applies batches (store.BatchWriter) and, while armed,
// reports batches that the engine applied as store.ErrOutcomeUnknown, as
// when the answer of a committed write is lost. The write is durable and
// visible like any other; only its writer is left in doubt. Everything
// else passes through to the engine.
type Uncertain struct {
	store.Engine
	w store.BatchWriter
	// armed is how many of the next applied batches (of user, if set)
	// are reported unknown; injected counts those that were.
	armed, injected atomic.Int64
	user            atomic.Pointer[string]
}

// NewUncertain wraps e, which must implement store.BatchWriter.
func NewUncertain(e store.Engine) *Uncertain {
	w, ok := e.(store.BatchWriter)
	if !ok {
		panic(fmt.Sprintf("storetest: engine %T does not apply batches", e))
	}
	return &Uncertain{Engine: e, w: w}
}

// Arm makes the next n batches the engine applies be reported unknown.
func (u *Uncertain) Arm(n int) {
	u.user.Store(nil)
	u.armed.Store(int64(n))
}

// ArmUser is Arm for the batches of one user only.
func (u *Uncertain) ArmUser(user string, n int) {
	u.user.Store(&user)
	u.armed.Store(int64(n))
}

// Injected returns how many batches were reported unknown.
func (u *Uncertain) Injected() int { return int(u.injected.Load()) }

// SubmitBatch implements store.BatchWriter: the engine applies b; its
// outcome is reported as it is, unless b was applied while armed.
func (u *Uncertain) SubmitBatch(ctx context.Context, b *store.Batch) (func() error, error) {
	wait, err := u.w.SubmitBatch(ctx, b)
	if err != nil {
		return nil, err
	}
	return func() error {
		if err := wait(); err != nil {
			return err
		}
		if only := u.user.Load(); only != nil && *only != b.User {
			return nil
		}
		for {
			n := u.armed.Load()
			if n <= 0 {
				return nil
			}
			if u.armed.CompareAndSwap(n, n-1) {
				u.injected.Add(1)
				return fmt.Errorf("storetest: batch applied, answer withheld: %w", store.ErrOutcomeUnknown)
			}
		}
	}, nil
}

// SetMeta passes store.MetaSetter through when the engine implements it
// (and keeps nothing otherwise, as the contract allows).
func (u *Uncertain) SetMeta(ctx context.Context, mailbox store.ID, metas map[uint32][]byte) error {
	if ms, ok := u.Engine.(store.MetaSetter); ok {
		return ms.SetMeta(ctx, mailbox, metas)
	}
	return nil
}
