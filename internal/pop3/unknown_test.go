package pop3

import (
	"context"
	"io"
	"net/netip"
	"strings"
	"testing"
	"time"

	"quill/internal/auth"
	"quill/internal/mailbox"
	"quill/internal/store"
	"quill/internal/store/embedded"
	"quill/internal/store/storetest"
	"quill/internal/usermgr"
)

// engineBackend is the real maildrop service over the real user manager
// and embedded engine, with the fault injector storetest.Uncertain between
// them; alice's password is "secret".
type engineBackend struct{ svc *mailbox.Service }

func (engineBackend) Authenticate(_ context.Context, user, pass string, _ netip.Addr) (string, error) {
	if user == "alice" && pass == "secret" {
		return user, nil
	}
	return "", auth.ErrInvalidCredentials
}

func (b engineBackend) OpenMaildrop(ctx context.Context, user string) (Maildrop, error) {
	m, err := b.svc.OpenMaildrop(ctx, user)
	if err != nil {
		return nil, err
	}
	msgs := make([]Message, m.Len())
	for i := range msgs {
		msgs[i] = Message{UID: m.UniqueID(i), Size: m.Size(i)}
	}
	return engineMaildrop{m, msgs}, nil
}

type engineMaildrop struct {
	m    *mailbox.Maildrop
	msgs []Message
}

func (d engineMaildrop) Messages() []Message { return d.msgs }
func (d engineMaildrop) Retrieve(ctx context.Context, i int) (io.ReadCloser, error) {
	return d.m.Open(ctx, i)
}
func (d engineMaildrop) Commit(ctx context.Context, deleted []int) error {
	return d.m.Commit(ctx, deleted)
}
func (d engineMaildrop) Close() error { return d.m.Close() }

// TestUpdateOfUnknownOutcome: when the store applies QUIT's expunge but
// reports its outcome unknown (store.ErrOutcomeUnknown), the server closes
// the connection with neither +OK nor -ERR; the next session finds the
// message deleted.
func TestUpdateOfUnknownOutcome(t *testing.T) {
	e, err := embedded.Open(t.TempDir(), embedded.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	u := storetest.NewUncertain(e)
	st := usermgr.New(u, usermgr.Options{})
	ctx := context.Background()
	if err := st.CreateUser(ctx, store.User{Address: "alice"}); err != nil {
		t.Fatal(err)
	}
	inbox, _ := st.GetMailbox(ctx, "alice", "INBOX")
	for _, body := range []string{"Subject: one\r\n\r\n1\r\n", "Subject: two\r\n\r\n2\r\n"} {
		if _, err := st.Append(ctx, inbox.ID, []store.NewMessage{{Body: []byte(body), Size: int64(len(body)), InternalDate: time.Now()}}, store.AppendOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	srv := &Server{Hostname: "pop.test", Backend: engineBackend{mailbox.NewService(st)}, Logger: testLogger(t)}
	addr := startServer(t, srv, netip.Addr{})

	session := func() *client {
		c := dial(t, addr, nil)
		c.readLine()
		for _, cmd := range []string{"USER alice", "PASS secret"} {
			c.send(cmd)
			if got := c.response(cmd); !strings.HasPrefix(got[0], "+OK") {
				t.Fatalf("%s: %q", cmd, got)
			}
		}
		return c
	}
	c := session()
	c.send("DELE 1")
	if got := c.response("DELE 1"); !strings.HasPrefix(got[0], "+OK") {
		t.Fatalf("DELE 1: %q", got)
	}
	u.Arm(1)
	c.send("QUIT")
	if got := c.readLine(); got != "<EOF>" {
		t.Fatalf("QUIT whose update's outcome is unknown: %q, want the connection closed without a reply", got)
	}
	if u.Injected() != 1 {
		t.Fatalf("%d updates reported unknown, want 1", u.Injected())
	}
	c = session()
	c.send("STAT")
	if got := c.response("STAT"); !strings.HasPrefix(got[0], "+OK 1 ") {
		t.Fatalf("STAT in the next session: %q, want one message left", got)
	}
	c.send("QUIT")
	if got := c.response("QUIT"); !strings.HasPrefix(got[0], "+OK") {
		t.Fatalf("QUIT: %q", got)
	}
}
