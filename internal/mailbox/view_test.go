package mailbox

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"quill/internal/store"
	"quill/internal/store/embedded"
	"quill/internal/usermgr"
)

// openStore opens an embedded engine on a temporary directory, closed
// when the test ends, with one user "u".
func openStore(t *testing.T, opts embedded.Options) *embedded.Engine {
	t.Helper()
	st, err := embedded.Open(t.TempDir(), opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	if err := st.CreateUser(context.Background(), store.User{Address: "u"}); err != nil {
		t.Fatal(err)
	}
	return st
}

// newMailboxes returns the mailbox service over st through a user manager
// that announces its writes on the service's hub, as the server builds
// it, and the manager, through which a test's own writes must go.
func newMailboxes(st *embedded.Engine) (*Mailboxes, *usermgr.Manager) {
	hub := NewHub()
	mgr := usermgr.New(st, usermgr.Options{Notifier: hub})
	return NewMailboxes(mgr, hub), mgr
}

func imapSetup(t *testing.T, n int) (*Mailboxes, *usermgr.Manager, *Hub) {
	t.Helper()
	m, mgr := newMailboxes(openStore(t, embedded.Options{}))
	for range n {
		appendMsg(t, m, "INBOX")
	}
	return m, mgr, m.hub
}

func appendMsg(t *testing.T, m *Mailboxes, mbox string) uint32 {
	t.Helper()
	ctx := context.Background()
	u := m.User("u")
	body, err := u.PutBody(ctx, strings.NewReader("Subject: x\r\n\r\ny\r\n"), 17, true)
	if err != nil {
		t.Fatal(err)
	}
	res, err := u.Append(ctx, mbox, []NewMessage{{Body: body, Date: time.Now()}})
	if err != nil {
		t.Fatal(err)
	}
	return res.UIDs[0]
}

// selectView selects name for user "u", closing the view when the test ends.
func selectView(t *testing.T, m *Mailboxes, name string) (*View, SelectInfo) {
	t.Helper()
	v, info, err := m.User("u").Select(context.Background(), name, false)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { v.Close() })
	return v, info
}

// Two views of one mailbox: an expunge and a flag change by one reach the
// other through Poll, the expunge held back while the command forbids it
// (RFC 3501 section 7.4.1), with sequence numbers that stay valid.
func TestViewPoll(t *testing.T) {
	m, _, _ := imapSetup(t, 4)
	ctx := context.Background()
	a, _ := selectView(t, m, "INBOX")
	b, info := selectView(t, m, "inbox")
	if info.Exists != 4 || info.Recent != 0 {
		t.Fatalf("second select: %+v, want 4 messages none recent (the first session claimed them)", info)
	}
	if _, err := a.SetFlags(ctx, []uint32{2}, FlagsAdd, []string{`\Seen`}); err != nil {
		t.Fatal(err)
	}
	if err := a.Expunge(ctx, []uint32{1, 3}); err != nil {
		t.Fatal(err)
	}
	select {
	case <-b.Changed():
	default:
		t.Fatal("no change notification")
	}
	up, err := b.Poll(ctx, false)
	if err != nil {
		t.Fatal(err)
	}
	if len(up.Expunged) != 0 || len(up.Flags) != 1 || up.Flags[0].Seq != 2 || b.Len() != 4 {
		t.Fatalf("poll without expunge: %+v, len %d", up, b.Len())
	}
	if err := b.Messages(ctx, []uint32{1, 2}, func(Message) error { return nil }); err != ErrExpunged {
		t.Fatalf("Messages of an expunged UID: %v, want ErrExpunged", err)
	}
	appendMsg(t, m, "INBOX")
	up, err = b.Poll(ctx, true)
	if err != nil {
		t.Fatal(err)
	}
	// Descending, so each number is valid when sent: 3 then 1. b polls
	// first, so the new message is \Recent in b only.
	if !slices.Equal(up.Expunged, []uint32{3, 1}) || !up.Exists || b.Len() != 3 || up.RecentCount != 1 {
		t.Fatalf("poll with expunge: %+v, len %d", up, b.Len())
	}
	if !slices.Equal(b.UIDs(), []uint32{2, 4, 5}) {
		t.Fatalf("UIDs %v", b.UIDs())
	}
	// a made the flag change itself: it is not reported to it again.
	up, err = a.Poll(ctx, true)
	if err != nil {
		t.Fatal(err)
	}
	if len(up.Flags) != 0 || !slices.Equal(up.Expunged, []uint32{3, 1}) || up.RecentCount != 2 {
		t.Fatalf("own changes: %+v", up)
	}
}

func TestRenameInbox(t *testing.T) {
	m, st, _ := imapSetup(t, 3)
	ctx := context.Background()
	if err := m.User("u").Rename(ctx, "inbox", "Old/Mail"); err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]uint32{"INBOX": 0, "Old/Mail": 3} {
		mb, err := st.GetMailbox(ctx, "u", name)
		if err != nil || mb.Messages != want {
			t.Errorf("%s: %d messages, %v; want %d", name, mb.Messages, err, want)
		}
	}
	if _, err := st.GetMailbox(ctx, "u", "Old"); err != nil {
		t.Errorf("parent of the new name: %v", err)
	}
}

// A view whose MODSEQ the store's change log no longer reaches (its
// expunges forgotten) is brought up to date by comparing UIDs: Poll
// reports the same EXPUNGE, EXISTS and FETCH FLAGS as from the log, and
// ChangesSince from before the floor reports every missing UID, as ranges.
func TestViewPastForgottenExpunges(t *testing.T) {
	m, st := newMailboxes(openStore(t, embedded.Options{ExpungeWindow: 2}))
	ctx := context.Background()
	for range 6 {
		appendMsg(t, m, "INBOX")
	}
	a, _ := selectView(t, m, "INBOX")
	b, _ := selectView(t, m, "INBOX")
	m0 := b.HighestModSeq()
	if _, err := a.SetFlags(ctx, []uint32{2}, FlagsAdd, []string{`\Seen`}); err != nil {
		t.Fatal(err)
	}
	if err := a.Expunge(ctx, []uint32{1, 3}); err != nil {
		t.Fatal(err)
	}
	// Deliveries expunged at once, as POP3 does, push the floor up.
	for range 5 {
		uid := appendMsg(t, m, "INBOX")
		if _, _, err := st.Expunge(ctx, b.id, []uint32{uid}); err != nil {
			t.Fatal(err)
		}
	}
	kept := appendMsg(t, m, "INBOX")
	mb, err := st.GetMailboxByID(ctx, b.id)
	if err != nil {
		t.Fatal(err)
	}
	if mb.ExpungeFloor <= m0 {
		t.Fatalf("floor %d, want above the view's modseq %d", mb.ExpungeFloor, m0)
	}
	up, err := b.Poll(ctx, true)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(up.Expunged, []uint32{3, 1}) || !slices.Equal(up.ExpungedUIDs, []uint32{1, 3}) || !up.Exists ||
		len(up.Flags) != 1 || up.Flags[0].UID != 2 || up.Flags[0].Seq != 1 {
		t.Fatalf("poll past the floor: %+v", up)
	}
	if want := []uint32{2, 4, 5, 6, kept}; !slices.Equal(b.UIDs(), want) {
		t.Fatalf("UIDs %v, want %v", b.UIDs(), want)
	}
	if b.HighestModSeq() != mb.HighestModSeq {
		t.Fatalf("view at modseq %d, want %d", b.HighestModSeq(), mb.HighestModSeq)
	}
	vanished, changed, err := b.ChangesSince(ctx, m0)
	if err != nil {
		t.Fatal(err)
	}
	if want := []UIDRange{{1, 1}, {3, 3}, {7, kept - 1}}; !slices.Equal(vanished, want) {
		t.Fatalf("vanished since %d: %v, want %v", m0, vanished, want)
	}
	if want := []uint32{2, kept}; !slices.Equal(changed, want) {
		t.Fatalf("changed since %d: %v, want %v", m0, changed, want)
	}
	// From above the floor the log still answers, exactly.
	vanished, changed, err = b.ChangesSince(ctx, mb.HighestModSeq-1)
	if err != nil {
		t.Fatal(err)
	}
	if len(vanished) != 0 || !slices.Equal(changed, []uint32{kept}) {
		t.Fatalf("since %d: vanished %v, changed %v", mb.HighestModSeq-1, vanished, changed)
	}
	// a took part in the same changes through the log or the listing.
	up, err = a.Poll(ctx, true)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(a.UIDs(), b.UIDs()) || len(up.Flags) != 0 {
		t.Fatalf("a: UIDs %v, updates %+v", a.UIDs(), up)
	}
}

// A STORE and an EXPUNGE that change more messages than one page of the
// change log reach another view whole: the store never ends a page inside
// a MODSEQ.
func TestViewPollLargeChange(t *testing.T) {
	const n = pageSize + 100
	m, _, _ := imapSetup(t, n)
	ctx := context.Background()
	a, _ := selectView(t, m, "INBOX")
	b, _ := selectView(t, m, "INBOX")
	m0 := b.HighestModSeq()
	uids := a.UIDs()
	if _, err := a.SetFlags(ctx, uids, FlagsAdd, []string{`\Seen`}); err != nil {
		t.Fatal(err)
	}
	if up, err := b.Poll(ctx, true); err != nil || len(up.Flags) != n {
		t.Fatalf("poll after STORE to %d messages: %d flag updates, %v", n, len(up.Flags), err)
	}
	if _, changed, err := b.ChangesSince(ctx, m0); err != nil || len(changed) != n {
		t.Fatalf("changes since %d: %d changed, %v; want %d", m0, len(changed), err, n)
	}
	if err := a.Expunge(ctx, uids[:n-1]); err != nil {
		t.Fatal(err)
	}
	if up, err := b.Poll(ctx, true); err != nil || len(up.Expunged) != n-1 || b.Len() != 1 {
		t.Fatalf("poll after EXPUNGE of %d: %d expunged, %d left, %v", n-1, len(up.Expunged), b.Len(), err)
	}
}
