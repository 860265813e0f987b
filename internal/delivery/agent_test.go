package delivery

import (
	"context"
	"errors"
	"io"
	"reflect"
	"strings"
	"testing"
	"testing/iotest"
	"time"

	"quill/internal/mail"
	"quill/internal/mime"
	"quill/internal/store"
	"quill/internal/store/embedded"
	"quill/internal/usermgr"
)

func setup(t *testing.T) (*Agent, *usermgr.Manager) {
	t.Helper()
	engine, err := embedded.Open(t.TempDir(), embedded.Options{})
	if err != nil {
		t.Fatal(err)
	}
	e := usermgr.New(engine, usermgr.Options{})
	t.Cleanup(func() {
		if problems, _ := e.Check(context.Background()); len(problems) > 0 {
			t.Errorf("store inconsistent: %v", problems)
		}
		e.Close()
	})
	ctx := context.Background()
	for _, u := range []store.User{
		{Address: "alice@example.test"},
		{Address: "bob@example.test", QuotaBytes: 100},
		{Address: "off@example.test", Status: store.UserDisabled},
	} {
		if err := e.CreateUser(ctx, u); err != nil {
			t.Fatal(err)
		}
	}
	if err := e.CreateAlias(ctx, "postmaster@example.test", "alice@example.test"); err != nil {
		t.Fatal(err)
	}
	return NewAgent(e, Options{Domains: []string{"Example.TEST."}, Hostname: "mx1.example.test", SubaddressSeparator: "+"}), e
}

func addr(t *testing.T, s string) mail.Address {
	t.Helper()
	a, err := mail.ParseAddress(s, true)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

func TestResolve(t *testing.T) {
	a, _ := setup(t)
	ctx := context.Background()
	for _, tc := range []struct {
		rcpt string
		opts ResolveOptions
		user string
		err  error
	}{
		{"alice@example.test", ResolveOptions{}, "alice@example.test", nil},
		{"ALICE@Example.Test", ResolveOptions{}, "alice@example.test", nil},
		{"alice@example.test.", ResolveOptions{}, "alice@example.test", nil},
		{"postmaster@example.test", ResolveOptions{}, "alice@example.test", nil},
		{"PostMaster@mx1.example.test", ResolveOptions{}, "alice@example.test", nil},
		{"alice@mx1.example.test", ResolveOptions{}, "", ErrRelayDenied},
		{"alice+lists@example.test", ResolveOptions{}, "alice@example.test", nil},
		{"nobody@example.test", ResolveOptions{}, "", ErrNoSuchUser},
		{"alice@elsewhere.test", ResolveOptions{}, "", ErrRelayDenied},
		{"alice@[192.0.2.1]", ResolveOptions{}, "", ErrRelayDenied},
		{"alice@elsewhere.test", ResolveOptions{Authenticated: true}, "", ErrOutboundDisabled},
		{"off@example.test", ResolveOptions{}, "", ErrDisabled},
		{"bob@example.test", ResolveOptions{Size: 50}, "bob@example.test", nil},
		{"bob@example.test", ResolveOptions{Size: 101}, "", ErrOverQuota},
	} {
		r, err := a.Resolve(ctx, addr(t, tc.rcpt), tc.opts)
		if !errors.Is(err, tc.err) || r.User != tc.user {
			t.Errorf("Resolve(%s, %+v) = %q, %v; want %q, %v", tc.rcpt, tc.opts, r.User, err, tc.user, tc.err)
		}
	}
}

func TestCheckSender(t *testing.T) {
	a, _ := setup(t)
	ctx := context.Background()
	if err := a.CheckSender(ctx, "alice@example.test", addr(t, "Alice@example.test")); err != nil {
		t.Errorf("own address: %v", err)
	}
	if err := a.CheckSender(ctx, "alice@example.test", addr(t, "postmaster@example.test")); err != nil {
		t.Errorf("own alias: %v", err)
	}
	for _, from := range []string{"bob@example.test", "ceo@elsewhere.test"} {
		if err := a.CheckSender(ctx, "alice@example.test", addr(t, from)); !errors.Is(err, ErrSenderNotAllowed) {
			t.Errorf("sender %s: %v", from, err)
		}
	}
	if err := a.CheckSender(ctx, "alice@example.test", mail.Address{}); !errors.Is(err, ErrSenderNotAllowed) {
		t.Errorf("null sender: %v", err)
	}
}

func readInbox(t *testing.T, e store.Engine, user string) []string {
	t.Helper()
	ctx := context.Background()
	m, err := e.GetMailbox(ctx, user, "INBOX")
	if err != nil {
		t.Fatal(err)
	}
	msgs, err := e.ListMessages(ctx, m.ID, 1, 100)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, msg := range msgs {
		r, err := e.OpenBlob(ctx, msg.Blob)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(r)
		out = append(out, string(b))
	}
	return out
}

func TestDeliver(t *testing.T) {
	a, e := setup(t)
	ctx := context.Background()
	var rcpts []Recipient
	for _, s := range []string{"alice@example.test", "postmaster@example.test", "bob@example.test"} {
		r, err := a.Resolve(ctx, addr(t, s), ResolveOptions{})
		if err != nil {
			t.Fatal(err)
		}
		rcpts = append(rcpts, r)
	}
	body := "Subject: hi\r\n\r\nhello\r\n"
	results, err := a.Deliver(ctx, Message{Recipients: rcpts, Body: strings.NewReader(body), ReceivedAt: time.Now()})
	if err != nil {
		t.Fatal(err)
	}
	for i, r := range results {
		if r != nil {
			t.Errorf("recipient %d: %v", i, r)
		}
	}
	if got := readInbox(t, e, "alice@example.test"); len(got) != 1 || got[0] != body {
		t.Errorf("alice (twice as recipient) got %q, want one copy", got)
	}
	if got := readInbox(t, e, "bob@example.test"); len(got) != 1 || got[0] != body {
		t.Errorf("bob got %q", got)
	}

	// bob's quota (100 bytes) is now partly used: a big message fails for
	// him only, and temporarily.
	big := strings.Repeat("x", 90)
	results, err = a.Deliver(ctx, Message{Recipients: rcpts[1:], Body: strings.NewReader(big), ReceivedAt: time.Now()})
	if err != nil || results[0] != nil || !errors.Is(results[1], ErrMailboxFull) {
		t.Fatalf("over-quota delivery = %v, %v", results, err)
	}

	boom := errors.New("connection lost")
	_, err = a.Deliver(ctx, Message{Recipients: rcpts[:1], Body: io.MultiReader(strings.NewReader("partial"), failing{boom})})
	if !errors.Is(err, boom) {
		t.Fatalf("broken body: %v", err)
	}
	if got := readInbox(t, e, "alice@example.test"); len(got) != 2 {
		t.Fatalf("alice has %d messages after a broken delivery, want 2", len(got))
	}

	// A client gone mid-message: the SMTP reader reports io.ErrUnexpectedEOF,
	// which must fail the delivery, small body or large, not store what
	// arrived as a shorter message.
	for _, partial := range []string{"Subject: cut\r\n\r\npart", strings.Repeat("y", inlineMax+10)} {
		_, err = a.Deliver(ctx, Message{Recipients: rcpts[:1], Body: io.MultiReader(strings.NewReader(partial), failing{io.ErrUnexpectedEOF})})
		if !errors.Is(err, io.ErrUnexpectedEOF) {
			t.Fatalf("body cut after %d octets: %v", len(partial), err)
		}
	}
	if got := readInbox(t, e, "alice@example.test"); len(got) != 2 {
		t.Fatalf("alice has %d messages after cut deliveries, want 2", len(got))
	}
}

type failing struct{ err error }

func (f failing) Read([]byte) (int, error) { return 0, f.err }

// deliverOne delivers a short message to r and returns its result.
func deliverOne(a *Agent, r Recipient) error {
	res, err := a.Deliver(context.Background(), Message{Recipients: []Recipient{r}, Body: strings.NewReader("x\r\n")})
	if err != nil {
		return err
	}
	return res[0]
}

func TestDeliverAfterUserRecreated(t *testing.T) {
	a, e := setup(t)
	ctx := context.Background()
	r, _ := a.Resolve(ctx, addr(t, "alice@example.test"), ResolveOptions{})
	deliver := func() error { return deliverOne(a, r) }
	if err := deliver(); err != nil {
		t.Fatal(err)
	}
	if err := e.DeleteUser(ctx, "alice@example.test"); err != nil {
		t.Fatal(err)
	}
	if err := e.CreateUser(ctx, store.User{Address: "alice@example.test"}); err != nil {
		t.Fatal(err)
	}
	if err := deliver(); err != nil {
		t.Fatalf("delivery to re-created user: %v", err)
	}
	if got := readInbox(t, e, "alice@example.test"); len(got) != 1 {
		t.Fatalf("re-created alice has %d messages", len(got))
	}
}

func TestDeliverStoresSummary(t *testing.T) {
	a, e := setup(t)
	ctx := context.Background()
	r, err := a.Resolve(ctx, addr(t, "alice@example.test"), ResolveOptions{})
	if err != nil {
		t.Fatal(err)
	}
	body := "From: Bob <bob@example.test>\r\nSubject: Re: report\r\nContent-Type: multipart/mixed; boundary=x\r\n\r\n" +
		"--x\r\nContent-Type: text/plain\r\n\r\nsee attached\r\n--x\r\nContent-Type: application/pdf\r\nContent-Transfer-Encoding: base64\r\n\r\nJVBERi0=\r\n--x--\r\n"
	// A reader that returns one octet at a time exercises the tee across
	// many small writes.
	res, err := a.Deliver(ctx, Message{Recipients: []Recipient{r}, Body: iotest.OneByteReader(strings.NewReader(body)), ReceivedAt: time.Now()})
	if err != nil || res[0] != nil {
		t.Fatalf("Deliver = %v, %v", res, err)
	}
	mb, err := e.GetMailbox(ctx, "alice@example.test", "INBOX")
	if err != nil {
		t.Fatal(err)
	}
	msgs, err := e.ListMessages(ctx, mb.ID, 1, 10)
	if err != nil || len(msgs) != 1 {
		t.Fatalf("ListMessages = %d messages, %v", len(msgs), err)
	}
	got, err := mime.Unmarshal(msgs[0].Meta)
	if err != nil {
		t.Fatalf("stored Meta does not decode: %v", err)
	}
	want, _ := mime.Parse(strings.NewReader(body))
	if !reflect.DeepEqual(got, want) {
		t.Errorf("stored summary differs from a fresh parse:\n got %+v\nwant %+v", got, want)
	}
	const bs = `(("text" "plain" NIL NIL NIL "7bit" 12 1)("application" "pdf" NIL NIL NIL "base64" 8) "mixed")`
	if s := string(got.AppendBodyStructure(nil, false)); s != bs {
		t.Errorf("BODY = %s, want %s", s, bs)
	}
	if got.Size != msgs[0].Size || got.BaseSubject != "report" {
		t.Errorf("summary size %d (message %d), base subject %q", got.Size, msgs[0].Size, got.BaseSubject)
	}
}

// With LazySummaries the body is stored byte-exact and without a summary,
// for one mailbox (inline) and for several (one shared blob); the first
// reader that needs one computes it (internal/imap).
func TestDeliverLazySummaries(t *testing.T) {
	_, e := setup(t)
	a := NewAgent(e, Options{Domains: []string{"example.test"}, LazySummaries: true})
	ctx := context.Background()
	var rcpts []Recipient
	for _, to := range []string{"alice@example.test", "bob@example.test"} {
		r, err := a.Resolve(ctx, addr(t, to), ResolveOptions{})
		if err != nil {
			t.Fatal(err)
		}
		rcpts = append(rcpts, r)
	}
	const body = "Subject: lazy\r\n\r\nno summary yet\r\n"
	for _, to := range [][]Recipient{rcpts[:1], rcpts} {
		res, err := a.Deliver(ctx, Message{Recipients: to, Body: strings.NewReader(body), ReceivedAt: time.Now()})
		if err != nil || res[0] != nil || res[len(res)-1] != nil {
			t.Fatalf("Deliver = %v, %v", res, err)
		}
	}
	for user, n := range map[string]int{"alice@example.test": 2, "bob@example.test": 1} {
		got := readInbox(t, e, user)
		if len(got) != n || got[n-1] != body {
			t.Fatalf("%s: inbox %q, want %d copies of the body", user, got, n)
		}
		mb, _ := e.GetMailbox(ctx, user, "INBOX")
		msgs, err := e.ListMessages(ctx, mb.ID, 1, 10)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range msgs {
			if len(m.Meta) != 0 {
				t.Errorf("%s UID %d: stored with a summary", user, m.UID)
			}
		}
	}
}

// A body to one mailbox goes inline with the append up to inlineMax and
// through PutBlob beyond; either way it is stored byte-exact with a summary
// of exactly those octets.
func TestDeliverBodySizes(t *testing.T) {
	a, e := setup(t)
	ctx := context.Background()
	r, err := a.Resolve(ctx, addr(t, "alice@example.test"), ResolveOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var want []string
	for i, n := range []int{0, 1, inlineMax - 1, inlineMax, inlineMax + 1, 3*inlineMax + 17} {
		body := "Subject: " + strings.Repeat(string(rune('a'+i)), n)
		body = body[:n]
		want = append(want, body)
		res, err := a.Deliver(ctx, Message{Recipients: []Recipient{r}, Body: iotest.HalfReader(strings.NewReader(body)), ReceivedAt: time.Now()})
		if err != nil || res[0] != nil {
			t.Fatalf("Deliver of %d octets = %v, %v", n, res, err)
		}
	}
	got := readInbox(t, e, "alice@example.test")
	if len(got) != len(want) {
		t.Fatalf("inbox has %d messages, want %d", len(got), len(want))
	}
	mb, _ := e.GetMailbox(ctx, "alice@example.test", "INBOX")
	msgs, _ := e.ListMessages(ctx, mb.ID, 1, 100)
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("message %d: stored %d octets, want %d", i, len(got[i]), len(want[i]))
		}
		sum, err := mime.Unmarshal(msgs[i].Meta)
		if err != nil || sum.Size != int64(len(want[i])) || msgs[i].Size != sum.Size {
			t.Errorf("message %d: size %d, summary size %d (%v), want %d", i, msgs[i].Size, sum.Size, err, len(want[i]))
		}
	}
}
