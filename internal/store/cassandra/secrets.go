package cassandra

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"time"

	gocql "github.com/apache/cassandra-gocql-driver/v2"

	"quill/internal/store"
)

var _ store.Secrets = (*Engine)(nil)

// CreateSecret implements store.Secrets with one LWT, INSERT ... IF NOT
// EXISTS, on the row of name in secrets: Paxos orders concurrent creators
// in every process, and exactly one is applied. When the LWT's outcome is
// unknown (a timeout), a serial read, which completes any round in
// progress, says whether the row holds this call's value.
func (e *Engine) CreateSecret(ctx context.Context, name string, value []byte) error {
	if err := store.CheckSecret(name, value); err != nil {
		return err
	}
	applied, err := e.cas(ctx, `INSERT INTO secrets (name, value, created) VALUES (?, ?, ?) IF NOT EXISTS`,
		name, value, time.Now()).MapScanCAS(map[string]any{})
	if err != nil {
		stored, rerr := e.GetSecret(ctx, name)
		switch {
		case rerr == nil && bytes.Equal(stored, value):
			return nil
		case rerr == nil:
			return fmt.Errorf("secret %s: %w", name, store.ErrExists)
		default:
			return wrap("creating secret "+name, fmt.Errorf("%w (then reading it: %w)", err, rerr))
		}
	}
	if !applied {
		return fmt.Errorf("secret %s: %w", name, store.ErrExists)
	}
	return nil
}

// GetSecret implements store.Secrets with a serial read, so that a value
// whose creation is in progress or was just applied is seen.
func (e *Engine) GetSecret(ctx context.Context, name string) ([]byte, error) {
	if err := store.CheckSecret(name, nil); err != nil {
		return nil, err
	}
	var value []byte
	err := e.serialRead(ctx, `SELECT value FROM secrets WHERE name = ?`, name).Scan(&value)
	if errors.Is(err, gocql.ErrNotFound) {
		return nil, fmt.Errorf("secret %s: %w", name, store.ErrNotFound)
	}
	if err != nil {
		return nil, wrap("reading secret "+name, err)
	}
	return value, nil
}
