package mailbox

import (
	"bytes"
	"context"
	"io"
	"strings"
	"testing"
	"testing/iotest"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"quill/internal/store/embedded"
)

// commits returns how many commit groups the engine registered on reg has
// synced.
func commits(t *testing.T, reg *prometheus.Registry) uint64 {
	t.Helper()
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fams {
		if f.GetName() == "quill_store_commit_seconds" {
			return f.GetMetric()[0].GetHistogram().GetSampleCount()
		}
	}
	t.Fatal("no quill_store_commit_seconds")
	return 0
}

// An APPEND literal held inline is written with its Append, in one commit
// group; a larger one, or one not offered inline, is stored first, in a
// group of its own. Either way the mailbox holds exactly the octets sent.
func TestPutBodyInline(t *testing.T) {
	reg := prometheus.NewRegistry()
	st := openStore(t, embedded.Options{Registerer: reg})
	ctx := context.Background()
	m, _ := newMailboxes(st)
	u := m.User("u")
	inbox, err := st.GetMailbox(ctx, "u", "INBOX")
	if err != nil {
		t.Fatal(err)
	}
	for i, c := range []struct {
		size    int
		inline  bool
		commits uint64
	}{
		{0, true, 1},
		{17, true, 1},
		{InlineBodyMax, true, 1},
		{InlineBodyMax + 1, true, 2},
		{17, false, 2},
	} {
		body := bytes.Repeat([]byte{'a' + byte(i)}, c.size)
		before := commits(t, reg)
		b, err := u.PutBody(ctx, iotest.HalfReader(bytes.NewReader(body)), int64(c.size), c.inline)
		if err != nil {
			t.Fatalf("PutBody of %d octets: %v", c.size, err)
		}
		res, err := u.Append(ctx, "INBOX", []NewMessage{{Body: b, Date: time.Now()}})
		if err != nil {
			t.Fatalf("Append of %d octets: %v", c.size, err)
		}
		if got := commits(t, reg) - before; got != c.commits {
			t.Errorf("%d octets, inline %v: %d commit groups, want %d", c.size, c.inline, got, c.commits)
		}
		m, err := st.GetMessage(ctx, inbox.ID, res.UIDs[0])
		if err != nil {
			t.Fatal(err)
		}
		r, err := st.OpenBlob(ctx, m.Blob)
		if err != nil {
			t.Fatal(err)
		}
		got, err := io.ReadAll(r)
		r.Close()
		if err != nil || !bytes.Equal(got, body) || m.Size != int64(c.size) {
			t.Errorf("%d octets, inline %v: stored %d octets (size %d), %v", c.size, c.inline, len(got), m.Size, err)
		}
	}
}

// A literal that does not hold exactly the octets announced, or that ends
// in a read error, is refused whether or not it would be held inline.
func TestPutBodyMismatch(t *testing.T) {
	m, _, _ := imapSetup(t, 0)
	u := m.User("u")
	ctx := context.Background()
	for _, inline := range []bool{true, false} {
		for _, c := range []struct {
			r    io.Reader
			size int64
		}{
			{strings.NewReader("short"), 6},
			{strings.NewReader("longer"), 5},
			{io.MultiReader(strings.NewReader("cut"), iotest.ErrReader(io.ErrUnexpectedEOF)), 5},
		} {
			if _, err := u.PutBody(ctx, c.r, c.size, inline); err == nil {
				t.Errorf("inline %v, %d octets announced: PutBody succeeded", inline, c.size)
			}
		}
	}
}
