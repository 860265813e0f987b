package store

import (
	"context"
	"fmt"
)

// Secrets holds a few small named values that every process sharing the
// store must agree on, created once and never changed: the cluster's
// credentials (internal/cluster/credentials). It is a contract of its own,
// beside Store, because nothing about mail uses it. Both engines implement
// it; storetest checks them.
type Secrets interface {
	// CreateSecret stores value under name if no value is stored there,
	// and fails with ErrExists otherwise, leaving the stored value as it
	// is. Of any number of concurrent calls for one name, in any number of
	// processes, exactly one succeeds, and every later GetSecret returns
	// its value. A call that fails otherwise (ErrUnavailable, a timeout)
	// may or may not have stored value: GetSecret tells.
	CreateSecret(ctx context.Context, name string, value []byte) error
	// GetSecret returns the value stored under name, or ErrNotFound. A
	// value whose CreateSecret returned is always found.
	GetSecret(ctx context.Context, name string) ([]byte, error)
}

// Limits of Secrets: names are short printable ASCII, values at most
// MaxSecretBytes.
const (
	MaxSecretName  = 128
	MaxSecretBytes = 64 << 10
)

// CheckSecret reports, as ErrInvalid, a name or value Secrets must refuse:
// an empty or over-long name, a name with bytes outside printable ASCII, an
// empty or over-long value (value nil checks the name only).
func CheckSecret(name string, value []byte) error {
	if name == "" || len(name) > MaxSecretName {
		return fmt.Errorf("%w: secret name of %d bytes (1 to %d)", ErrInvalid, len(name), MaxSecretName)
	}
	for i := 0; i < len(name); i++ {
		if name[i] <= ' ' || name[i] > '~' {
			return fmt.Errorf("%w: secret name %q is not printable ASCII", ErrInvalid, name)
		}
	}
	if value != nil && (len(value) == 0 || len(value) > MaxSecretBytes) {
		return fmt.Errorf("%w: secret value of %d bytes (1 to %d)", ErrInvalid, len(value), MaxSecretBytes)
	}
	return nil
}
