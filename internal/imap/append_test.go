package imap

import (
	"bufio"
	"context"
	"io"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"testing"

	"quill/internal/mailbox"
)

// A MULTIAPPEND whose literals add up to more than mailbox.InlineBodyMax
// holds in memory those that fit the remaining budget (here the first and
// the last) and stores the others before the append;
// every message is stored exactly, in the order sent, by one append.
func TestMultiAppendPastInlineBudget(t *testing.T) {
	backend := newTestBackend(t)
	srv := &Server{Hostname: "imap.test", Backend: backend, Logger: testLogger(t)}
	nc, err := net.Dial("tcp", startServer(t, srv, netip.Addr{}))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	c := &benchClient{conn: nc, r: bufio.NewReader(nc)}
	if _, err := c.r.ReadString('\n'); err != nil {
		t.Fatal(err)
	}
	c.do(t, "LOGIN alice secret")
	var bodies []string
	cmd := "APPEND Drafts"
	for i, n := range []int{mailbox.InlineBodyMax - 100, 200, 150_000, 20} {
		head := "Subject: " + strconv.Itoa(i) + "\r\n\r\n"
		body := head + strings.Repeat(string(rune('a'+i)), n-len(head))
		bodies = append(bodies, body)
		cmd += " {" + strconv.Itoa(len(body)) + "+}\r\n" + body
	}
	c.do(t, cmd)

	ctx := context.Background()
	drafts, err := backend.st.GetMailbox(ctx, "alice", "Drafts")
	if err != nil {
		t.Fatal(err)
	}
	msgs, err := backend.st.ListMessages(ctx, drafts.ID, 1, 10)
	if err != nil || len(msgs) != len(bodies) {
		t.Fatalf("Drafts holds %d messages (%v), want %d", len(msgs), err, len(bodies))
	}
	for i, m := range msgs {
		if m.ModSeq != msgs[0].ModSeq {
			t.Errorf("message %d appended at MODSEQ %d, the first at %d: not one append", i, m.ModSeq, msgs[0].ModSeq)
		}
		r, err := backend.st.OpenBlob(ctx, m.Blob)
		if err != nil {
			t.Fatal(err)
		}
		got, err := io.ReadAll(r)
		r.Close()
		if err != nil || string(got) != bodies[i] {
			t.Errorf("message %d: stored %d octets (%v), sent %d", i, len(got), err, len(bodies[i]))
		}
	}
}
