package imap

import (
	"fmt"
	"log/slog"
	"testing"

	"quill/internal/auth"
)

// A login refused because too many password checks are running answers
// NO [UNAVAILABLE] (RFC 5530) and does not count as the client's error.
func TestBusyIsUnavailable(t *testing.T) {
	s := &session{log: slog.New(slog.DiscardHandler)}
	pe, counts := s.replyFor(fmt.Errorf("checking: %w", auth.ErrBusy))
	if !pe.no || pe.code != "UNAVAILABLE" || counts {
		t.Fatalf("replyFor(ErrBusy) = %+v, counts %v", pe, counts)
	}
}
