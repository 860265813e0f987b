package embedded

import (
	"bytes"
	"context"
	"fmt"

	"quill/internal/store"
)

var _ store.Secrets = (*Engine)(nil)

func secretKey(name string) []byte { return key(tSecret, []byte(name)) }

// CreateSecret implements store.Secrets: the committer runs the check and
// the write as one transaction, and one process at a time opens the
// engine, so concurrent calls are ordered and exactly one finds no value.
// The value is durable when it returns, like every committed write.
func (e *Engine) CreateSecret(ctx context.Context, name string, value []byte) error {
	if err := store.CheckSecret(name, value); err != nil {
		return err
	}
	value = bytes.Clone(value)
	return e.update(ctx, func(t *txn) error {
		if ok, err := t.exists(secretKey(name)); err != nil {
			return err
		} else if ok {
			return fmt.Errorf("secret %s: %w", name, store.ErrExists)
		}
		t.set(secretKey(name), value)
		return nil
	})
}

// GetSecret implements store.Secrets.
func (e *Engine) GetSecret(ctx context.Context, name string) ([]byte, error) {
	if err := store.CheckSecret(name, nil); err != nil {
		return nil, err
	}
	v, err := e.read(secretKey(name))
	if err != nil {
		return nil, fmt.Errorf("secret %s: %w", name, err)
	}
	// A value from the overlay lies in its arena: the caller gets a copy.
	return bytes.Clone(v), nil
}
