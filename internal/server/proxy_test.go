package server

import (
	"bufio"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"quill/internal/config"
)

// proxyConn connects to addr as a proxy would and sends hdr; it returns
// the connection and a reader of the server's replies.
func proxyConn(t *testing.T, addr string, hdr []byte) (net.Conn, *bufio.Reader) {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	c.SetDeadline(time.Now().Add(30 * time.Second))
	if _, err := c.Write(hdr); err != nil {
		t.Fatal(err)
	}
	return c, bufio.NewReader(c)
}

// v2For is a PROXY v2 header for an IPv4 client.
func v2For(client string, port uint16) []byte {
	ip := net.ParseIP(client).To4()
	b := []byte("\r\n\r\n\x00\r\nQUIT\n\x21\x11\x00\x0c")
	b = append(b, ip...)
	b = append(b, 192, 0, 2, 1)
	b = binary.BigEndian.AppendUint16(b, port)
	return binary.BigEndian.AppendUint16(b, 143)
}

func startProxied(t *testing.T, trusted ...string) (config.Config, string) {
	t.Helper()
	cfg := testConfig(t)
	cfg.Listeners.SMTP, cfg.Listeners.POP3, cfg.Listeners.LMTPSocket = "off", "off", ""
	cfg.Listeners.IMAP = "127.0.0.1:0"
	cfg.ProxyProtocol.Listeners = []string{"imap"}
	cfg.ProxyProtocol.TrustedProxies = trusted
	cfg.Limits.MaxConnectionsPerIP = 1
	cfg.Auth.MaxFailures = 2
	// The clients are not on loopback any more: plaintext LOGIN needs this.
	cfg.Auth.AllowInsecure = true
	addUser(t, cfg, "alice@example.test")
	s := startServer(t, cfg)
	return cfg, s.Listeners()["imap"]
}

// Behind a trusted proxy, the client's address from the PROXY header (v1
// or v2) is the peer for the connection limit and the login throttle.
func TestProxyProtocolClientAddress(t *testing.T) {
	_, addr := startProxied(t, "127.0.0.0/8")
	login := func(c net.Conn, r *bufio.Reader, tag, user, pass string) string {
		t.Helper()
		fmt.Fprintf(c, "%s LOGIN %s %s\r\n", tag, user, pass)
		for {
			line, err := r.ReadString('\n')
			if err != nil {
				t.Fatalf("%s: %v", tag, err)
			}
			if strings.HasPrefix(line, tag+" ") {
				return strings.TrimSpace(line)
			}
		}
	}
	greet := func(r *bufio.Reader) string {
		line, _ := r.ReadString('\n')
		return line
	}

	a, ar := proxyConn(t, addr, []byte("PROXY TCP4 203.0.113.7 192.0.2.1 50000 143\r\n"))
	if g := greet(ar); !strings.HasPrefix(g, "* OK") {
		t.Fatalf("v1 client greeted %q", g)
	}
	// One connection per client address (max_connections_per_ip = 1):
	// a second one from the same client is refused, whatever the proxy.
	_, a2r := proxyConn(t, addr, v2For("203.0.113.7", 50001))
	if g := greet(a2r); strings.HasPrefix(g, "* OK") {
		t.Fatalf("second connection of one client greeted %q", g)
	}
	b, br := proxyConn(t, addr, v2For("203.0.113.8", 50002))
	if g := greet(br); !strings.HasPrefix(g, "* OK") {
		t.Fatalf("v2 client greeted %q", g)
	}

	for i := range 2 {
		if r := login(a, ar, fmt.Sprintf("f%d", i), fmt.Sprintf("nobody%d", i), "guess"); !strings.Contains(r, "[AUTHENTICATIONFAILED]") {
			t.Fatalf("failure %d: %s", i, r)
		}
	}
	if r := login(a, ar, "f2", "nobody2", "guess"); !strings.Contains(r, "[UNAVAILABLE]") {
		t.Fatalf("third failure from one client: %s", r)
	}
	// Another client through the same proxy has its own budget.
	if r := login(b, br, "ok", "alice", "password1"); !strings.HasPrefix(r, "ok OK") {
		t.Fatalf("other client: %s", r)
	}
}

// A peer that is not a trusted proxy is refused without a greeting, so it
// cannot claim an address with a header of its own.
func TestProxyProtocolUntrustedPeer(t *testing.T) {
	_, addr := startProxied(t, "192.0.2.0/24")
	c, r := proxyConn(t, addr, []byte("PROXY TCP4 203.0.113.7 192.0.2.1 50000 143\r\n"))
	_ = c
	if b, _ := io.ReadAll(r); len(b) != 0 {
		t.Fatalf("untrusted peer got %q", b)
	}
}

// The client address from the header is the one the Received field names.
func TestProxyProtocolReceivedField(t *testing.T) {
	cfg := testConfig(t)
	cfg.Listeners.LMTPSocket = ""
	cfg.ProxyProtocol.Listeners = []string{"smtp"}
	cfg.ProxyProtocol.TrustedProxies = []string{"127.0.0.1"}
	addUser(t, cfg, "alice@example.test")
	s := startServer(t, cfg)
	ls := s.Listeners()

	c, _ := proxyConn(t, ls["smtp"], []byte("PROXY TCP6 2001:db8::7 2001:db8::1 50000 25\r\n"))
	replies := converse(t, c, "EHLO client.example.test", "MAIL FROM:<sender@remote.test>",
		"RCPT TO:<alice@example.test>", "DATA", "Subject: via a proxy\r\n\r\nhello\r\n.", "QUIT")
	if !strings.HasPrefix(replies[len(replies)-2], "250 ") {
		t.Fatalf("delivery through the proxy: %q", replies)
	}
	p, err := net.Dial("tcp", ls["pop3"])
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	p.SetDeadline(time.Now().Add(30 * time.Second))
	r := bufio.NewReader(p)
	r.ReadString('\n')
	fmt.Fprintf(p, "USER alice\r\nPASS password1\r\nRETR 1\r\n")
	var msg strings.Builder
	for {
		line, err := r.ReadString('\n')
		if err != nil {
			t.Fatalf("POP3: %v (so far %q)", err, msg.String())
		}
		msg.WriteString(line)
		if line == ".\r\n" || strings.HasPrefix(line, "-ERR") {
			break
		}
	}
	if !strings.Contains(msg.String(), "([IPv6:2001:db8::7])") {
		t.Fatalf("Received field does not name the client:\n%s", msg.String())
	}
}
