package smtp

import (
	"fmt"
	"testing"

	"quill/internal/delivery"
)

// A body refused for want of room in the body memory budget is a
// temporary failure the client retries (451 4.3.1, RFC 3463).
func TestReplyForBusy(t *testing.T) {
	err := fmt.Errorf("delivery: storing body: reading body: %w", delivery.ErrBusy)
	r, known := replyFor(err)
	if !known || r.code != 451 || r.enh != "4.3.1" {
		t.Fatalf("replyFor(ErrBusy) = %+v, %v", r, known)
	}
}
