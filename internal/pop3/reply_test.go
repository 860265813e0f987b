package pop3

import (
	"fmt"
	"log/slog"
	"strings"
	"testing"

	"quill/internal/auth"
)

// A login refused because too many password checks are running is a
// temporary failure (RFC 3206 SYS/TEMP) that does not count as the
// client's error.
func TestBusyIsSysTemp(t *testing.T) {
	re, counts := errorReply(slog.New(slog.DiscardHandler), fmt.Errorf("checking: %w", auth.ErrBusy))
	if !strings.HasPrefix(re.text, "[SYS/TEMP]") || counts {
		t.Fatalf("errorReply(ErrBusy) = %q, counts %v", re.text, counts)
	}
}
