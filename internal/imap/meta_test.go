package imap

import (
	"bytes"
	"context"
	"net/netip"
	"strings"
	"testing"

	"quill/internal/mime"
	"quill/internal/store"
)

// A message delivered without a summary (delivery.Options.LazySummaries)
// gets one at the first FETCH that needs it: the responses are those a
// stored summary gives, the summary is kept with the message, and keeping
// it changes no MODSEQ (docs/adr/0011).
func TestSummaryKeptAtFirstFetch(t *testing.T) {
	backend := newTestBackend(t)
	addr := startServer(t, &Server{Hostname: "imap.test", Backend: backend, Logger: testLogger(t)}, netip.MustParseAddr("127.0.0.1"))
	ctx := context.Background()
	inbox, err := backend.st.GetMailbox(ctx, "alice", "INBOX")
	if err != nil {
		t.Fatal(err)
	}
	stored := func() []store.Message {
		t.Helper()
		msgs, err := backend.st.ListMessages(ctx, inbox.ID, 1, 10)
		if err != nil || len(msgs) != 3 {
			t.Fatalf("ListMessages = %d messages, %v", len(msgs), err)
		}
		return msgs
	}
	for _, m := range stored() {
		if len(m.Meta) != 0 {
			t.Fatalf("UID %d stored with a summary; the fixture delivers without", m.UID)
		}
	}

	c := dial(t, addr, nil)
	c.readLines()
	c.command("a LOGIN alice secret")
	c.command("b SELECT INBOX (CONDSTORE)")
	first := c.command("c FETCH 1:3 (ENVELOPE BODYSTRUCTURE MODSEQ)")
	if last := first[len(first)-1]; !strings.HasPrefix(last, "c OK") {
		t.Fatalf("FETCH: %q", first)
	}
	if !strings.Contains(strings.Join(first, "\n"), `"lunch"`) {
		t.Fatalf("FETCH ENVELOPE lacks the subject: %q", first)
	}

	for _, m := range stored() {
		r, err := backend.st.OpenBlob(ctx, m.Blob)
		if err != nil {
			t.Fatal(err)
		}
		want, err := mime.Parse(r)
		r.Close()
		if err != nil {
			t.Fatal(err)
		}
		wantMeta, _ := want.MarshalBinary()
		if !bytes.Equal(m.Meta, wantMeta) {
			t.Errorf("UID %d: kept summary differs from a parse of the body", m.UID)
		}
	}
	again := c.command("d FETCH 1:3 (ENVELOPE BODYSTRUCTURE MODSEQ)")
	if strings.Join(first[:len(first)-1], "\n") != strings.Join(again[:len(again)-1], "\n") {
		t.Errorf("FETCH from the kept summaries differs:\nfirst %q\nagain %q", first, again)
	}
	mb, err := backend.st.GetMailboxByID(ctx, inbox.ID)
	if err != nil {
		t.Fatal(err)
	}
	if mb.HighestModSeq != inbox.HighestModSeq {
		t.Errorf("HIGHESTMODSEQ moved from %d to %d", inbox.HighestModSeq, mb.HighestModSeq)
	}
	if problems, err := backend.st.Check(ctx); err != nil || len(problems) > 0 {
		t.Errorf("Check = %v, %v", problems, err)
	}
}

// A FETCH over more messages than keepMetaBatch keeps their summaries a
// batch at a time, and every one of them.
func TestSummariesKeptInBatches(t *testing.T) {
	backend := newTestBackend(t)
	ctx := context.Background()
	inbox, err := backend.st.GetMailbox(ctx, "bob", "INBOX")
	if err != nil {
		t.Fatal(err)
	}
	n := keepMetaBatch + keepMetaBatch/2
	nms := make([]store.NewMessage, n)
	for i := range nms {
		body := []byte("Subject: number " + strings.Repeat("i", i%7+1) + "\r\n\r\nbody\r\n")
		nms[i] = store.NewMessage{Body: body, Size: int64(len(body)), InternalDate: fixtureDate}
	}
	if _, err := backend.st.Append(ctx, inbox.ID, nms, store.AppendOptions{}); err != nil {
		t.Fatal(err)
	}
	addr := startServer(t, &Server{Hostname: "imap.test", Backend: backend, Logger: testLogger(t)}, netip.MustParseAddr("127.0.0.1"))
	c := dial(t, addr, nil)
	c.readLines()
	c.command("a LOGIN bob hunter2")
	c.command("b SELECT INBOX")
	got := c.command("c FETCH 1:* ENVELOPE")
	if len(got) != n+1 || !strings.HasPrefix(got[n], "c OK") {
		t.Fatalf("FETCH returned %d lines, ending %q", len(got), got[len(got)-1])
	}
	msgs, err := backend.st.ListMessages(ctx, inbox.ID, 1, n)
	if err != nil || len(msgs) != n {
		t.Fatalf("ListMessages = %d messages, %v", len(msgs), err)
	}
	for _, m := range msgs {
		if sum, err := mime.Unmarshal(m.Meta); err != nil || sum.Size != m.Size {
			t.Fatalf("UID %d: no summary kept (%v)", m.UID, err)
		}
	}
}
