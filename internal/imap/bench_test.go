package imap

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"testing"
	"time"

	"quill/internal/mime"
	"quill/internal/store"
)

// BenchmarkIMAP measures single commands over the wire against a mailbox
// of n messages on the real embedded engine, built once per size with
// batched Appends (messages with stored summaries, as delivery makes
// them). Select a size with -bench 'IMAP/n=10000' (or n=100000); figures
// are in docs/adr/0008-imap.md.
//
// The single-message commands (UID FETCH of one message, UID STORE) must
// not grow with n; FetchFlags100 is one command over 100 messages;
// SearchUIDRange reads only the 10 messages its UID set names, so it must
// not grow either; SearchFlagged and SortDate read every message's
// metadata and grow linearly. Append stores a 2.5 KB message durably (a
// LITERAL+ APPEND): its time is the store's commit, fsync included.
func BenchmarkIMAP(b *testing.B) {
	for _, n := range []int{10_000, 100_000} {
		b.Run("n="+strconv.Itoa(n), func(b *testing.B) {
			c := benchSetup(b, n)
			uid := func(i int) int { return (i*7919)%n + 1 }
			for _, bc := range []struct {
				name string
				cmd  func(i int) string
			}{
				{"FetchFlags", func(i int) string { return fmt.Sprintf("UID FETCH %d (FLAGS)", uid(i)) }},
				{"FetchEnvelope", func(i int) string { return fmt.Sprintf("UID FETCH %d (ENVELOPE)", uid(i)) }},
				{"FetchBodyStructure", func(i int) string { return fmt.Sprintf("UID FETCH %d (BODYSTRUCTURE)", uid(i)) }},
				{"FetchBody", func(i int) string { return fmt.Sprintf("UID FETCH %d BODY.PEEK[]", uid(i)) }},
				{"FetchFlags100", func(i int) string {
					s := (i*7919)%(n-100) + 1
					return fmt.Sprintf("FETCH %d:%d (FLAGS)", s, s+99)
				}},
				{"Store", func(i int) string {
					op := "+"
					if i%2 == 1 {
						op = "-"
					}
					return fmt.Sprintf("UID STORE %d %sFLAGS.SILENT (\\Answered)", uid(i/2), op)
				}},
				{"SearchFlagged", func(int) string { return "SEARCH FLAGGED" }},
				{"SearchUIDRange", func(i int) string { return fmt.Sprintf("UID SEARCH UID %d:%d", uid(i), uid(i)+9) }},
				{"SortDate", func(int) string { return "SORT (DATE) UTF-8 FLAGGED" }},
				// Last: it adds to the mailbox the others read.
				{"Append", func(i int) string {
					body := benchBody(i)
					return "APPEND INBOX {" + strconv.Itoa(len(body)) + "+}\r\n" + body
				}},
			} {
				b.Run(bc.name, func(b *testing.B) {
					i := 0
					for b.Loop() {
						c.do(b, bc.cmd(i))
						i++
					}
				})
			}
		})
	}
}

// benchBodies are the distinct message bodies of a benchmark mailbox: a
// multipart/alternative message of about 2.5 KB with a varying subject.
func benchBody(i int) string {
	text := strings.Repeat("The quarterly figures are attached; see the summary below.\r\n", 20)
	return "From: \"Carol Example\" <carol@example.org>\r\nTo: alice@example.org, bob@example.org\r\n" +
		"Cc: team@example.org\r\nSubject: Re: report " + strconv.Itoa(i) + "\r\n" +
		"Date: Mon, " + strconv.Itoa(1+i%28) + " Jan 2024 10:00:00 +0100\r\n" +
		"Message-ID: <" + strconv.Itoa(i) + "@example.org>\r\nReferences: <0@example.org>\r\n" +
		"MIME-Version: 1.0\r\nContent-Type: multipart/alternative; boundary=\"b1\"\r\n\r\n" +
		"--b1\r\nContent-Type: text/plain; charset=utf-8\r\n\r\n" + text +
		"--b1\r\nContent-Type: text/html; charset=utf-8\r\nContent-Transfer-Encoding: quoted-printable\r\n\r\n<p>" + text + "</p>\r\n--b1--\r\n"
}

// benchSetup fills alice's INBOX with n messages (16 distinct bodies, one
// in 100 \Flagged, every other \Seen) and returns a session that has
// selected it.
func benchSetup(b *testing.B, n int) *benchClient {
	b.Helper()
	backend := newTestBackend(b)
	ctx := context.Background()
	inbox, err := backend.st.GetMailbox(ctx, "alice", "INBOX")
	if err != nil {
		b.Fatal(err)
	}
	// The fixture's three messages stay; n counts what is added.
	type body struct {
		id   store.ID
		size int64
		meta []byte
	}
	var bodies []body
	for i := range 16 {
		raw := benchBody(i)
		id, size, err := backend.st.PutBlob(ctx, strings.NewReader(raw), 1<<20)
		if err != nil {
			b.Fatal(err)
		}
		sum, err := mime.Parse(strings.NewReader(raw))
		if err != nil {
			b.Fatal(err)
		}
		meta, err := sum.MarshalBinary()
		if err != nil {
			b.Fatal(err)
		}
		bodies = append(bodies, body{id, size, meta})
	}
	date := time.Date(2024, 1, 1, 0, 0, 0, 0, time.UTC)
	batch := make([]store.NewMessage, 0, 1000)
	for i := range n {
		bd := bodies[i%len(bodies)]
		var flags []string
		if i%2 == 0 {
			flags = append(flags, store.FlagSeen)
		}
		if i%100 == 0 {
			flags = append(flags, store.FlagFlagged)
		}
		batch = append(batch, store.NewMessage{Blob: bd.id, Size: bd.size, Flags: flags,
			InternalDate: date.Add(time.Duration(i) * time.Minute), Meta: bd.meta})
		if len(batch) == cap(batch) || i == n-1 {
			if _, err := backend.st.Append(ctx, inbox.ID, batch, store.AppendOptions{}); err != nil {
				b.Fatal(err)
			}
			batch = batch[:0]
		}
	}
	srv := &Server{Hostname: "imap.test", Backend: backend, Logger: slog.New(slog.DiscardHandler),
		// One client sends commands back to back, far above a real client's rate.
		CommandRate: 1e9, CommandBurst: 1 << 30}
	addr := startServer(b, srv, netip.Addr{})
	nc, err := net.Dial("tcp", addr)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { nc.Close() })
	c := &benchClient{conn: nc, r: bufio.NewReaderSize(nc, 64<<10)}
	if _, err := c.r.ReadString('\n'); err != nil {
		b.Fatal(err)
	}
	c.do(b, "LOGIN alice secret")
	c.do(b, "SELECT INBOX")
	return c
}

// benchClient is a lean IMAP client: the benchmarks should measure the
// server, not a test harness.
type benchClient struct {
	conn net.Conn
	r    *bufio.Reader
	seq  int
}

// do sends one command and reads its response through the tagged line,
// skipping literals; a NO or BAD fails the test or benchmark.
func (c *benchClient) do(b testing.TB, cmd string) {
	c.seq++
	tag := "b" + strconv.Itoa(c.seq)
	if _, err := io.WriteString(c.conn, tag+" "+cmd+"\r\n"); err != nil {
		b.Fatal(err)
	}
	for {
		line, err := c.r.ReadSlice('\n')
		if err == bufio.ErrBufferFull {
			// A long untagged line (SEARCH results): keep reading.
			for err == bufio.ErrBufferFull {
				line, err = c.r.ReadSlice('\n')
			}
			if err != nil {
				b.Fatal(err)
			}
			continue
		}
		if err != nil {
			b.Fatal(err)
		}
		s := strings.TrimSuffix(string(line), "\r\n")
		if strings.HasSuffix(s, "}") {
			if i := strings.LastIndexByte(s, '{'); i >= 0 {
				if n, err := strconv.Atoi(s[i+1 : len(s)-1]); err == nil {
					if _, err := c.r.Discard(n); err != nil {
						b.Fatal(err)
					}
					continue
				}
			}
		}
		if strings.HasPrefix(s, tag+" ") {
			if !strings.HasPrefix(s, tag+" OK") {
				b.Fatalf("%s: %s", cmd, s)
			}
			return
		}
	}
}
