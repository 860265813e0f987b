package smtp

import (
	"bufio"
	"context"
	"io"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"testing"
	"time"

	"quill/internal/auth"
	"quill/internal/delivery"
	"quill/internal/mail"
	"quill/internal/store"
	"quill/internal/store/embedded"
	"quill/internal/store/storetest"
	"quill/internal/usermgr"
)

// engineBackend is the real delivery agent over the real user manager and
// embedded engine, with the fault injector storetest.Uncertain between
// them. It authenticates no one (MX and LMTP need no AUTH).
type engineBackend struct {
	*delivery.Agent
}

func (engineBackend) Authenticate(context.Context, string, string, netip.Addr) (string, error) {
	return "", auth.ErrInvalidCredentials
}

func (engineBackend) CheckSender(context.Context, string, mail.Address) error { return nil }

func newEngineBackend(t *testing.T) (engineBackend, *storetest.Uncertain, *usermgr.Manager) {
	t.Helper()
	e, err := embedded.Open(t.TempDir(), embedded.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	u := storetest.NewUncertain(e)
	st := usermgr.New(u, usermgr.Options{})
	for _, user := range []string{"alice@example.org", "bob@example.org"} {
		if err := st.CreateUser(context.Background(), store.User{Address: user}); err != nil {
			t.Fatal(err)
		}
	}
	return engineBackend{delivery.NewAgent(st, delivery.Options{Domains: []string{"example.org"}, Hostname: "mx.example.org"})}, u, st
}

// inboxCount returns the messages in user's INBOX.
func inboxCount(t *testing.T, st store.Store, user string) uint32 {
	t.Helper()
	mb, err := st.GetMailbox(context.Background(), user, "INBOX")
	if err != nil {
		t.Fatal(err)
	}
	return mb.Messages
}

// readUntilEOF reads what the server sends until it closes the
// connection, which it must do before the deadline.
func readUntilEOF(t *testing.T, c net.Conn, br *bufio.Reader) string {
	t.Helper()
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	rest, err := io.ReadAll(br)
	if err != nil {
		t.Fatalf("reading to the end of the connection: %v (read %q)", err, rest)
	}
	return string(rest)
}

// TestDeliveryOfUnknownOutcome: when the store applies a delivery but
// reports its outcome unknown (store.ErrOutcomeUnknown), SMTP closes the
// connection with no reply to the end of the data (DATA or BDAT LAST),
// LMTP sends the replies of the recipients before the unknown one and
// then closes; no 4xx or 5xx is sent, and the message is stored.
func TestDeliveryOfUnknownOutcome(t *testing.T) {
	const body = "Subject: x\r\n\r\nhello\r\n"
	cases := []struct {
		name    string
		mode    Mode
		rcpts   []string
		unknown string // the user whose append is reported unknown
		data    func(c net.Conn, br *bufio.Reader, t *testing.T)
		// want is what the server sends after the data, then it closes.
		want string
	}{
		{name: "SMTP DATA", mode: ModeMX, rcpts: []string{"alice"}, unknown: "alice@example.org"},
		{name: "SMTP DATA two recipients", mode: ModeMX, rcpts: []string{"alice", "bob"}, unknown: "bob@example.org"},
		{name: "SMTP BDAT LAST", mode: ModeMX, rcpts: []string{"alice"}, unknown: "alice@example.org",
			data: func(c net.Conn, br *bufio.Reader, t *testing.T) {
				_, _ = io.WriteString(c, "BDAT "+strconv.Itoa(len(body))+" LAST\r\n"+body)
			}},
		{name: "LMTP first recipient unknown", mode: ModeLMTP, rcpts: []string{"alice", "bob"}, unknown: "alice@example.org"},
		{name: "LMTP second recipient unknown", mode: ModeLMTP, rcpts: []string{"alice", "bob"}, unknown: "bob@example.org",
			want: "250 2.0.0 <alice@example.org> Delivered\r\n"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			b, u, st := newEngineBackend(t)
			srv := newTestServer(t, b)
			srv.Mode = tc.mode
			addr := startServer(t, srv, nil)
			c, br := dialRaw(t, addr)
			hello := "EHLO"
			if tc.mode == ModeLMTP {
				hello = "LHLO"
			}
			_, _ = io.WriteString(c, hello+" client.example\r\n")
			readReplies(t, c, br, 1)
			_, _ = io.WriteString(c, "MAIL FROM:<s@remote.example>\r\n")
			readReplies(t, c, br, 1)
			for _, r := range tc.rcpts {
				_, _ = io.WriteString(c, "RCPT TO:<"+r+"@example.org>\r\n")
				if got := readReplies(t, c, br, 1); !strings.HasPrefix(got[0], "250") {
					t.Fatalf("RCPT %s: %q", r, got)
				}
			}
			u.ArmUser(tc.unknown, 1)
			if tc.data != nil {
				tc.data(c, br, t)
			} else {
				_, _ = io.WriteString(c, "DATA\r\n")
				if got := readReplies(t, c, br, 1); !strings.HasPrefix(got[0], "354") {
					t.Fatalf("DATA: %q", got)
				}
				_, _ = io.WriteString(c, body+".\r\n")
			}
			if got := readUntilEOF(t, c, br); got != tc.want {
				t.Fatalf("after the data: %q, then the connection closed; want %q", got, tc.want)
			}
			if u.Injected() != 1 {
				t.Fatalf("%d appends reported unknown, want 1", u.Injected())
			}
			for _, r := range tc.rcpts {
				if n := inboxCount(t, st, r+"@example.org"); n != 1 {
					t.Fatalf("INBOX of %s: %d messages, want 1", r, n)
				}
			}
			// The server takes the next connection as usual.
			c2, br2 := dialRaw(t, addr)
			_, _ = io.WriteString(c2, "QUIT\r\n")
			if got := readReplies(t, c2, br2, 1); !strings.HasPrefix(got[0], "221") {
				t.Fatalf("QUIT on a new connection: %q", got)
			}
		})
	}
}
