package imap

import (
	"net"
	"strings"
	"testing"

	"quill/internal/textconn/textconntest"
)

// The message bodies of one FETCH share network writes: the connection's
// output buffer grows at the first body (textconn.Conn.GrowWriteBuffer),
// so three bodies each larger than its initial 4 KiB go out together.
func TestFetchBodiesShareWrites(t *testing.T) {
	backend := newTestBackend(t)
	body := "Subject: big\r\n\r\n" + strings.Repeat("0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcde\r\n", 96)
	for range 3 {
		backend.deliver(t, "bob", body)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	cl := &textconntest.WriteCountingListener{Listener: ln}
	addr := serveListener(t, &Server{Hostname: "imap.test", Backend: backend, Logger: testLogger(t)}, cl)
	c := dial(t, addr, nil)
	c.readLines()
	c.command("a LOGIN bob hunter2")
	c.command("b SELECT INBOX")
	before := cl.Writes()
	got := c.command("c FETCH 1:3 BODY.PEEK[]")
	if last := got[len(got)-1]; !strings.HasPrefix(last, "c OK") {
		t.Fatalf("FETCH: %q", last)
	}
	if n := strings.Count(strings.Join(got, "\n"), "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcde"); n != 3*96 {
		t.Fatalf("FETCH returned %d body lines, want %d", n, 3*96)
	}
	// One write for what preceded the first body, when the buffer grew,
	// and one for the rest.
	if n := cl.Writes() - before; n > 2 {
		t.Errorf("FETCH of three bodies took %d network writes, want at most 2", n)
	}
}
