package smtp

import (
	"bufio"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"net/netip"
	"net/smtp"
	"net/textproto"
	"strings"
	"testing"
	"time"
)

// dialRaw connects to addr and reads the greeting.
func dialRaw(t *testing.T, addr string) (net.Conn, *bufio.Reader) {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	br := bufio.NewReader(c)
	readReplies(t, c, br, 1)
	return c, br
}

func TestStoredMessageForm(t *testing.T) {
	b := &testBackend{}
	srv := newTestServer(t, b)
	addr := startServer(t, srv, nil)
	c, br := dialRaw(t, addr)
	// Bare LF line endings are normalised; ".." is unstuffed; a "." line
	// ended or preceded by a bare LF is content, not the end of data (SMTP
	// smuggling); the real end is CRLF "." CRLF.
	_, _ = io.WriteString(c, "EHLO client.example\r\nMAIL FROM:<s@remote.example>\r\nRCPT TO:<alice@example.org>\r\nDATA\r\n")
	readReplies(t, c, br, 4)
	_, _ = io.WriteString(c, "Subject: t\r\n\r\n..stuffed\nbare\n.\nMAIL FROM:<smuggled@x>\r\nstray\rCR\r\n.\r\n")
	got := readReplies(t, c, br, 1)
	if got[0] != "250 2.0.0 OK: message accepted" {
		t.Fatalf("reply %q", got)
	}
	msgs := b.delivered()
	if len(msgs) != 1 {
		t.Fatalf("%d messages", len(msgs))
	}
	want := "Return-Path: <s@remote.example>\r\n" +
		"Received: from client.example ([127.0.0.1])\r\n" +
		"\tby mx.example.org (Quill) with ESMTP id "
	body := string(msgs[0].body)
	if !strings.HasPrefix(body, want) {
		t.Fatalf("trace fields:\n%q\nwant prefix\n%q", body, want)
	}
	wantTail := "\r\n\tfor <alice@example.org>;\r\n\tFri, 02 Jan 2026 03:04:05 +0000\r\n" +
		"Subject: t\r\n\r\n.stuffed\r\nbare\r\n.\r\nMAIL FROM:<smuggled@x>\r\nstray\rCR\r\n"
	if !strings.HasSuffix(body, wantTail) {
		t.Fatalf("body:\n%q\nwant suffix\n%q", body, wantTail)
	}
}

func TestReceivedProtocolNames(t *testing.T) {
	b := &testBackend{}
	srv := newTestServer(t, b)
	srvTLS, cliTLS := testTLS(t)
	srv.Mode, srv.TLSConfig = ModeSubmission, srvTLS
	addr := startServer(t, srv, nil)
	c, br := dialRaw(t, addr)
	_, _ = io.WriteString(c, "EHLO client.example\r\nSTARTTLS\r\n")
	readReplies(t, c, br, 2)
	tc := tls.Client(c, cliTLS)
	br = bufio.NewReader(tc)
	_, _ = io.WriteString(tc, "EHLO client.example\r\nAUTH PLAIN AGFsaWNlQGV4YW1wbGUub3JnAHNlY3JldA==\r\n"+
		"MAIL FROM:<alice@example.org> SMTPUTF8\r\nRCPT TO:<δοκιμή@example.org>\r\nRCPT TO:<bob@example.org>\r\nBDAT 3 LAST\r\nhi\n")
	got := readReplies(t, tc, br, 6)
	if got[len(got)-1] != "250 2.0.0 OK: message accepted" {
		t.Fatalf("replies %q", got)
	}
	body := string(b.delivered()[0].body)
	if !strings.Contains(body, " with UTF8SMTPSA id ") || strings.Contains(body, "\tfor <") {
		t.Fatalf("Received field: %q", body)
	}
	if !strings.HasSuffix(body, "\r\nhi\r\n") {
		t.Fatalf("BDAT bare LF not normalised: %q", body)
	}
}

// TestNetSMTPClient is a round trip with Go's own client: STARTTLS, AUTH
// PLAIN, one message.
func TestNetSMTPClient(t *testing.T) {
	b := &testBackend{}
	srv := newTestServer(t, b)
	srvTLS, cliTLS := testTLS(t)
	srv.Mode, srv.TLSConfig = ModeSubmission, srvTLS
	addr := startServer(t, srv, &net.TCPAddr{IP: net.ParseIP("192.0.2.7"), Port: 40000})

	c, err := smtp.Dial(addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := c.Hello("client.example"); err != nil {
		t.Fatal(err)
	}
	if ok, _ := c.Extension("AUTH"); ok {
		t.Fatal("AUTH offered before TLS to a remote peer")
	}
	if err := c.StartTLS(cliTLS); err != nil {
		t.Fatal(err)
	}
	host, _, _ := net.SplitHostPort(addr)
	if err := c.Auth(smtp.PlainAuth("", "alice@example.org", "secret", host)); err != nil {
		t.Fatal(err)
	}
	if err := c.Mail("alice@example.org"); err != nil {
		t.Fatal(err)
	}
	if err := c.Rcpt("bob@example.org"); err != nil {
		t.Fatal(err)
	}
	var te *textproto.Error
	if err := c.Rcpt("friend@remote.example"); !errors.As(err, &te) || te.Code != 550 || !strings.HasPrefix(te.Msg, "5.7.1 ") {
		t.Fatalf("remote recipient: %v", err)
	}
	w, err := c.Data()
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.WriteString(w, "Subject: hello\n\n.leading dot\nbye\n")
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	if err := c.Quit(); err != nil {
		t.Fatal(err)
	}
	msgs := b.delivered()
	if len(msgs) != 1 || msgs[0].rcpts[0].User != "bob@example.org" {
		t.Fatalf("delivered %+v", msgs)
	}
	body := string(msgs[0].body)
	// net/smtp sends SMTPUTF8 whenever offered, hence UTF8SMTPSA (RFC 6531).
	if !strings.Contains(body, " with UTF8SMTPSA id ") ||
		!strings.HasSuffix(body, "Subject: hello\r\n\r\n.leading dot\r\nbye\r\n") {
		t.Fatalf("body %q", body)
	}
}

// TestBrokenConnectionAbortsDelivery: a client that vanishes mid-DATA makes
// the body reader fail, so Deliver stores nothing.
func TestBrokenConnectionAbortsDelivery(t *testing.T) {
	b := &testBackend{}
	srv := newTestServer(t, b)
	addr := startServer(t, srv, nil)
	c, br := dialRaw(t, addr)
	_, _ = io.WriteString(c, "EHLO client.example\r\nMAIL FROM:<s@remote.example>\r\nRCPT TO:<alice@example.org>\r\nDATA\r\n")
	readReplies(t, c, br, 4)
	_, _ = io.WriteString(c, "Subject: cut\r\n\r\npartial")
	c.Close()
	// Shutdown (in startServer's cleanup) waits for the session to end;
	// check afterwards.
	t.Cleanup(func() {
		if n := len(b.delivered()); n != 0 {
			t.Errorf("%d messages stored from a broken connection", n)
		}
	})
}

// TestConnectionLimit: over the per-IP limit a client gets 421 and the
// server keeps serving the others.
func TestConnectionLimit(t *testing.T) {
	srv := newTestServer(t, &testBackend{})
	srv.Limiter = newLimiterForTest()
	addr := startServer(t, srv, nil)
	first, firstBR := dialRaw(t, addr)
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	br := bufio.NewReader(c)
	got := readReplies(t, c, br, 1)
	if got[0] != "421 4.7.0 mx.example.org Too many connections, try again later" {
		t.Fatalf("over limit: %q", got)
	}
	_, _ = io.WriteString(first, "NOOP\r\n")
	if got := readReplies(t, first, firstBR, 1); got[0] != "250 2.0.0 OK" {
		t.Fatalf("first connection: %q", got)
	}
}

// RFC 5321 section 4.1.3: an IPv6 client's address literal is tagged, an
// IPv4 one is not (an IPv4-mapped IPv6 address is written as IPv6, as the
// connection reports it).
func TestAddressLiteral(t *testing.T) {
	for ip, want := range map[string]string{
		"192.0.2.1":        "[192.0.2.1]",
		"2001:db8::1":      "[IPv6:2001:db8::1]",
		"::ffff:192.0.2.1": "[IPv6:::ffff:192.0.2.1]",
	} {
		if got := string(appendAddressLiteral([]byte("x"), netip.MustParseAddr(ip))); got != "x"+want {
			t.Errorf("%s: %q, want %q", ip, got, "x"+want)
		}
	}
}
