package cassandra

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	gocql "github.com/apache/cassandra-gocql-driver/v2"

	"quill/internal/store"
)

// A keyspace holds the mailboxes of one of the engine's two modes, never
// both: "ordered", where the engine orders its own writes with LWTs on the
// `mailboxes` head (ADR 0006; the Engine itself), or "batches", where user
// managers' batches are applied under fencing epochs (ADR 0026;
// Engine.Batches). The two keep mailboxes in different tables with
// different rules, so a process of one mode would not see the other's
// mail, and would create a second INBOX beside it. The first mailbox call
// of either mode on a keyspace records its mode in keyspace_mode with one
// LWT (IF NOT EXISTS); every later call of the other mode, in any process,
// fails with ErrModeMismatch.
const (
	modeOrdered = "ordered"
	modeBatches = "batches"
)

// Mode is a keyspace's engine mode, as Engine.Mode reports it.
type Mode string

const (
	// ModeNone: no mode recorded and no mailboxes; the first mailbox call
	// of either mode, or ClaimMode, records one.
	ModeNone Mode = ""
	// ModeOrdered: the engine orders its own writes with LWTs (ADR 0006).
	ModeOrdered Mode = modeOrdered
	// ModeBatches: user managers' batches under fencing epochs (ADR 0026).
	ModeBatches Mode = modeBatches
)

// Mode reports the keyspace's mode: the recorded one, ModeOrdered for a
// keyspace that holds ordered mailboxes written before the record
// existed, else ModeNone. It records nothing. A recorded mode never
// changes, so a caller may rely on it for the life of the keyspace.
func (e *Engine) Mode(ctx context.Context) (Mode, error) {
	e.mode.mu.Lock()
	defer e.mode.mu.Unlock()
	if e.mode.mode != "" {
		return Mode(e.mode.mode), nil
	}
	var mode string
	err := e.serialRead(ctx, `SELECT mode FROM keyspace_mode WHERE k = 0`).Scan(&mode)
	if err == nil {
		e.mode.mode = mode
		return Mode(mode), nil
	}
	if !errors.Is(err, gocql.ErrNotFound) {
		return ModeNone, wrap("reading the keyspace mode", err)
	}
	var id []byte
	err = e.read(ctx, `SELECT id FROM mailboxes LIMIT 1`).Scan(&id)
	if err == nil {
		return ModeOrdered, nil
	}
	if !errors.Is(err, gocql.ErrNotFound) {
		return ModeNone, wrap("looking for ordered mailboxes", err)
	}
	return ModeNone, nil
}

// ClaimMode records m as the keyspace's mode if none is recorded (one
// LWT), as the first mailbox call of that mode would, and returns nil
// once the keyspace is of mode m. A keyspace of the other mode (recorded,
// or ordered mailboxes from before the record) fails with
// ErrModeMismatch. `quill cluster init` claims ModeBatches (ADR 0031).
func (e *Engine) ClaimMode(ctx context.Context, m Mode) error {
	if m != ModeOrdered && m != ModeBatches {
		return fmt.Errorf("%w: cassandra: no engine mode %q", store.ErrInvalid, m)
	}
	return e.requireMode(ctx, string(m))
}

// ErrModeMismatch is returned (wrapped, and wrapping store.ErrConflict)
// by every mailbox call of one mode on a keyspace that holds the other's.
var ErrModeMismatch = fmt.Errorf("%w: keyspace holds mailboxes of the other engine mode", store.ErrConflict)

// modeClaim is an engine's knowledge of its keyspace's mode.
type modeClaim struct {
	mu   sync.Mutex
	mode string // "" until read or claimed
}

// requireMode returns nil once the keyspace is known to be of mode want,
// claiming it if no mode is recorded yet. After the first success it costs
// a mutex.
func (e *Engine) requireMode(ctx context.Context, want string) error {
	e.mode.mu.Lock()
	defer e.mode.mu.Unlock()
	if e.mode.mode == "" {
		got, err := e.claimMode(ctx, want)
		if err != nil {
			return err
		}
		e.mode.mode = got
	}
	if e.mode.mode != want {
		return fmt.Errorf("keyspace %s is in %s mode, not %s: %w", e.opts.Keyspace, e.mode.mode, want, ErrModeMismatch)
	}
	return nil
}

// claimMode reads the recorded mode and records want if there is none. A
// keyspace written by a version of the engine that predates the record
// (ordered mailboxes and no record) is claimed for the ordered mode by its
// first ordered call and refused to the batch mode.
func (e *Engine) claimMode(ctx context.Context, want string) (string, error) {
	var mode string
	err := e.serialRead(ctx, `SELECT mode FROM keyspace_mode WHERE k = 0`).Scan(&mode)
	if err == nil {
		return mode, nil
	}
	if !errors.Is(err, gocql.ErrNotFound) {
		return "", wrap("reading the keyspace mode", err)
	}
	if want == modeBatches {
		var id []byte
		err := e.read(ctx, `SELECT id FROM mailboxes LIMIT 1`).Scan(&id)
		if err == nil {
			return modeOrdered, nil // ordered mailboxes from before the record
		}
		if !errors.Is(err, gocql.ErrNotFound) {
			return "", wrap("looking for ordered mailboxes", err)
		}
	}
	row := map[string]any{}
	applied, err := e.cas(ctx, `INSERT INTO keyspace_mode (k, mode, claimed) VALUES (0, ?, ?) IF NOT EXISTS`,
		want, time.Now()).MapScanCAS(row)
	if err != nil {
		// The outcome is unknown: a serial read settles it.
		if rerr := e.serialRead(ctx, `SELECT mode FROM keyspace_mode WHERE k = 0`).Scan(&mode); rerr == nil {
			return mode, nil
		}
		return "", wrap("recording the keyspace mode", err)
	}
	if applied {
		e.log.Info("cassandra keyspace mode recorded", "keyspace", e.opts.Keyspace, "mode", want)
		return want, nil
	}
	if m, ok := row["mode"].(string); ok {
		return m, nil
	}
	return "", fmt.Errorf("cassandra: keyspace mode claim not applied and no mode returned")
}
