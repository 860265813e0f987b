package smtp

import (
	"fmt"
	"testing"

	"quill/internal/auth"
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

// Authentication errors that ask the client to come back later get the
// RFC 4954 section 6 temporary reply, never the generic 451.
func TestAuthTemporaryReplies(t *testing.T) {
	for _, err := range []error{auth.ErrThrottled, fmt.Errorf("checking: %w", auth.ErrBusy)} {
		r, known := replyFor(err)
		if !known || r.code != 454 || r.enh != "4.7.0" {
			t.Errorf("replyFor(%v) = %+v, known %v; want 454 4.7.0", err, r, known)
		}
	}
}
