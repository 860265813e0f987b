package mailbox

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"testing"

	"quill/internal/store"
	"quill/internal/store/embedded"
	"quill/internal/usermgr"
)

func setup(t *testing.T, n int) (*Service, *usermgr.Manager) {
	t.Helper()
	engine, err := embedded.Open(t.TempDir(), embedded.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { engine.Close() })
	e := usermgr.New(engine, usermgr.Options{})
	ctx := context.Background()
	if err := e.CreateUser(ctx, store.User{Address: "u@example.test"}); err != nil {
		t.Fatal(err)
	}
	inbox, _ := e.GetMailbox(ctx, "u@example.test", "INBOX")
	for i := 0; i < n; i++ {
		id, size, err := e.PutBlob(ctx, strings.NewReader(fmt.Sprintf("message %d\r\n", i)), 0)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := e.Append(ctx, inbox.ID, []store.NewMessage{{Blob: id, Size: size}}, store.AppendOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	return NewService(e), e
}

func TestMaildropLockAndCommit(t *testing.T) {
	s, e := setup(t, 3)
	ctx := context.Background()
	m, err := s.OpenMaildrop(ctx, "u@example.test")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.OpenMaildrop(ctx, "u@example.test"); !errors.Is(err, ErrInUse) {
		t.Fatalf("second open: %v, want ErrInUse", err)
	}
	if m.Len() != 3 || m.Size(0) != int64(len("message 0\r\n")) {
		t.Fatalf("Len %d, Size(0) %d", m.Len(), m.Size(0))
	}
	if a, b := m.UniqueID(0), m.UniqueID(1); a == b || !strings.HasSuffix(a, ".1") {
		t.Fatalf("unique ids %q, %q", a, b)
	}
	r, err := m.Open(ctx, 2)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(r)
	r.Close()
	if string(body) != "message 2\r\n" {
		t.Fatalf("message 3 = %q", body)
	}
	firstID := m.UniqueID(0)
	if err := m.Commit(ctx, []int{0, 2}); err != nil {
		t.Fatal(err)
	}
	m2, err := s.OpenMaildrop(ctx, "u@example.test")
	if err != nil {
		t.Fatalf("open after commit: %v", err)
	}
	defer m2.Close()
	if m2.Len() != 1 || m2.UniqueID(0) == firstID {
		t.Fatalf("after deleting 1 and 3: %d messages, first id %q", m2.Len(), m2.UniqueID(0))
	}
	if problems, _ := e.Check(ctx); len(problems) > 0 {
		t.Fatal(problems)
	}
}

func TestMaildropCloseKeepsMessages(t *testing.T) {
	s, _ := setup(t, 2)
	ctx := context.Background()
	m, err := s.OpenMaildrop(ctx, "u@example.test")
	if err != nil {
		t.Fatal(err)
	}
	m.Close()
	m.Close() // idempotent: must not release someone else's lock
	m2, err := s.OpenMaildrop(ctx, "u@example.test")
	if err != nil {
		t.Fatal(err)
	}
	defer m2.Close()
	if m2.Len() != 2 {
		t.Fatalf("after Close without commit: %d messages", m2.Len())
	}
	if _, err := s.OpenMaildrop(ctx, "nobody@example.test"); err == nil {
		t.Fatal("maildrop of a missing user opened")
	}
	// A failed open must not leave the lock behind.
	if _, err := s.OpenMaildrop(ctx, "nobody@example.test"); errors.Is(err, ErrInUse) {
		t.Fatal("failed open left the maildrop locked")
	}
}
