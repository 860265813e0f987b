package textconn

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"
)

// v2Header builds a v2 PROXY header for src -> dst (TCP), with extra bytes
// (TLVs) after the addresses.
func v2Header(src, dst netip.AddrPort, extra []byte) []byte {
	var b bytes.Buffer
	b.Write(v2Signature)
	b.WriteByte(0x21)
	var addrs []byte
	if src.Addr().Is4() {
		b.WriteByte(0x11)
		a, d := src.Addr().As4(), dst.Addr().As4()
		addrs = append(append(addrs, a[:]...), d[:]...)
	} else {
		b.WriteByte(0x21)
		a, d := src.Addr().As16(), dst.Addr().As16()
		addrs = append(append(addrs, a[:]...), d[:]...)
	}
	addrs = binary.BigEndian.AppendUint16(addrs, src.Port())
	addrs = binary.BigEndian.AppendUint16(addrs, dst.Port())
	addrs = append(addrs, extra...)
	b.Write(binary.BigEndian.AppendUint16(nil, uint16(len(addrs))))
	b.Write(addrs)
	return b.Bytes()
}

func TestReadProxyHeader(t *testing.T) {
	src4, dst4 := netip.MustParseAddrPort("203.0.113.7:50000"), netip.MustParseAddrPort("192.0.2.1:143")
	src6, dst6 := netip.MustParseAddrPort("[2001:db8::7]:50000"), netip.MustParseAddrPort("[2001:db8::1]:143")
	local := append(append([]byte{}, v2Signature...), 0x20, 0x00, 0x00, 0x00)
	tests := []struct {
		in   string
		want netip.AddrPort // zero: the proxy's own address stays
		bad  bool
	}{
		{"PROXY TCP4 203.0.113.7 192.0.2.1 50000 143\r\n", src4, false},
		{"PROXY TCP6 2001:db8::7 2001:db8::1 50000 143\r\n", src6, false},
		{"PROXY UNKNOWN\r\n", netip.AddrPort{}, false},
		{"PROXY UNKNOWN ffff::1 ffff::2 1 2\r\n", netip.AddrPort{}, false},
		{string(v2Header(src4, dst4, nil)), src4, false},
		{string(v2Header(src6, dst6, []byte{0x04, 0x00, 0x01, 0x00})), src6, false},
		{string(local), netip.AddrPort{}, false},
		{"PROXY TCP4 2001:db8::7 192.0.2.1 50000 143\r\n", netip.AddrPort{}, true},
		{"PROXY TCP4 203.0.113.7 192.0.2.1 050000 143\r\n", netip.AddrPort{}, true},
		{"PROXY TCP4 203.0.113.7 192.0.2.1 65536 143\r\n", netip.AddrPort{}, true},
		{"PROXY TCP4 203.0.113.7 192.0.2.1 1\r\n", netip.AddrPort{}, true},
		{"PROXY TCP4 203.0.113.7 192.0.2.1 1 2\n", netip.AddrPort{}, true},
		{"PROXY " + strings.Repeat("x", 120) + "\r\n", netip.AddrPort{}, true},
		{"EHLO client.example\r\n", netip.AddrPort{}, true},
		{string(v2Signature[:8]) + "QUIX\n\x21\x11\x00\x0c", netip.AddrPort{}, true},
		{string(append(append([]byte{}, v2Signature...), 0x21, 0x12, 0, 12)) + strings.Repeat("\x00", 12), netip.AddrPort{}, true},
		{string(append(append([]byte{}, v2Signature...), 0x21, 0x11, 0, 4)) + "\x01\x02\x03\x04", netip.AddrPort{}, true},
		{string(append(append([]byte{}, v2Signature...), 0x21, 0x11, 0xff, 0xff)), netip.AddrPort{}, true},
		{string(append(append([]byte{}, v2Signature...), 0x11, 0x11, 0, 0)), netip.AddrPort{}, true},
	}
	for _, tt := range tests {
		r := strings.NewReader(tt.in + "A1 LOGIN")
		h, err := ReadProxyHeader(r)
		if tt.bad {
			if err == nil {
				t.Errorf("ReadProxyHeader(%q) = %+v, want an error", tt.in, h)
			}
			continue
		}
		if err != nil || h.Source != tt.want {
			t.Errorf("ReadProxyHeader(%q) = %+v, %v; want source %v", tt.in, h, err, tt.want)
			continue
		}
		// Nothing after the header was consumed.
		if rest, _ := io.ReadAll(r); string(rest) != "A1 LOGIN" {
			t.Errorf("ReadProxyHeader(%q) left %q", tt.in, rest)
		}
	}
}

// FuzzReadProxyHeader: no input panics, none makes the parser read past
// the bounds of a header, and a header that parses is self-delimiting: it
// parses the same without what follows it.
func FuzzReadProxyHeader(f *testing.F) {
	f.Add([]byte("PROXY TCP4 203.0.113.7 192.0.2.1 50000 143\r\n"))
	f.Add([]byte("PROXY TCP6 2001:db8::7 2001:db8::1 50000 143\r\n"))
	f.Add([]byte("PROXY UNKNOWN\r\n"))
	f.Add(v2Header(netip.MustParseAddrPort("203.0.113.7:1"), netip.MustParseAddrPort("192.0.2.1:2"), nil))
	f.Add(v2Header(netip.MustParseAddrPort("[2001:db8::7]:1"), netip.MustParseAddrPort("[2001:db8::1]:2"), []byte{1, 0, 0}))
	f.Add(append(append([]byte{}, v2Signature...), 0x20, 0, 0, 0))
	f.Add([]byte("EHLO x\r\n"))
	f.Fuzz(func(t *testing.T, in []byte) {
		const tail = "\x00TAIL"
		r := bytes.NewReader(append(append([]byte{}, in...), tail...))
		h, err := ReadProxyHeader(r)
		used := len(in) + len(tail) - r.Len()
		if used > 16+maxV2Block {
			t.Fatalf("read %d bytes", used)
		}
		if err == nil {
			if h.Source.IsValid() && !h.Destination.IsValid() {
				t.Fatalf("source without destination: %+v", h)
			}
			// A header delimits itself: its bytes alone parse the same.
			whole := append(append([]byte{}, in...), tail...)[:used]
			r2 := bytes.NewReader(whole)
			h2, err := ReadProxyHeader(r2)
			if err != nil || h2 != h || r2.Len() != 0 {
				t.Fatalf("header %q parsed alone: %+v, %v, %d left; with what follows: %+v", whole, h2, err, r2.Len(), h)
			}
		}
	})
}

// proxyListen starts a ProxyListener on loopback trusting trusted, and a
// loop answering each accepted connection with its RemoteAddr.
func proxyListen(t *testing.T, trusted ...string) *ProxyListener {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var pfx []netip.Prefix
	for _, s := range trusted {
		pfx = append(pfx, netip.MustParsePrefix(s))
	}
	pl := NewProxyListener(ln, pfx, 500*time.Millisecond, slog.New(slog.DiscardHandler))
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			nc, err := pl.Accept()
			if err != nil {
				return
			}
			go func() {
				defer nc.Close()
				io.WriteString(nc, nc.RemoteAddr().String()+"\r\n")
				// Echo the first line after the header: nothing was lost.
				line, _ := bufio.NewReader(nc).ReadString('\n')
				io.WriteString(nc, line)
			}()
		}
	}()
	t.Cleanup(func() {
		pl.Close()
		<-done
	})
	return pl
}

// exchange sends hdr and a line and returns what the server answered.
func exchange(t *testing.T, addr string, hdr []byte) (string, error) {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := c.Write(append(hdr, "hello\r\n"...)); err != nil {
		return "", err
	}
	b, err := io.ReadAll(c)
	return string(b), err
}

func TestProxyListener(t *testing.T) {
	pl := proxyListen(t, "127.0.0.0/8")
	addr := pl.Addr().String()
	got, err := exchange(t, addr, []byte("PROXY TCP4 203.0.113.7 192.0.2.1 50000 143\r\n"))
	if err != nil || got != "203.0.113.7:50000\r\nhello\r\n" {
		t.Fatalf("v1: %q, %v", got, err)
	}
	got, err = exchange(t, addr, v2Header(netip.MustParseAddrPort("[2001:db8::7]:4242"), netip.MustParseAddrPort("[2001:db8::1]:143"), nil))
	if err != nil || got != "[2001:db8::7]:4242\r\nhello\r\n" {
		t.Fatalf("v2: %q, %v", got, err)
	}
	// A health check (LOCAL) keeps the proxy's address.
	got, err = exchange(t, addr, append(append([]byte{}, v2Signature...), 0x20, 0, 0, 0))
	if err != nil || !strings.HasPrefix(got, "127.0.0.1:") {
		t.Fatalf("v2 LOCAL: %q, %v", got, err)
	}
	// A malformed header, or none within the timeout, closes the connection.
	if got, _ := exchange(t, addr, []byte("PROXY TCP4 bogus\r\n")); got != "" {
		t.Fatalf("malformed header answered %q", got)
	}
	if got, _ := exchange(t, addr, nil); got != "" {
		t.Fatalf("no header answered %q", got)
	}
}

// A peer outside the trusted networks is closed unread: its header would
// let it claim any address.
func TestProxyListenerUntrustedPeer(t *testing.T) {
	pl := proxyListen(t, "192.0.2.0/24")
	got, err := exchange(t, pl.Addr().String(), []byte("PROXY TCP4 203.0.113.7 192.0.2.1 50000 143\r\n"))
	if got != "" {
		t.Fatalf("untrusted peer answered %q (%v)", got, err)
	}
}

func TestProxyListenerClose(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	pl := NewProxyListener(ln, []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}, time.Minute, slog.New(slog.DiscardHandler))
	// A proxy that connects but never sends its header is closed by Close.
	c, err := net.Dial("tcp", pl.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	for deadline := time.Now().Add(10 * time.Second); ; {
		pl.mu.Lock()
		n := len(pl.mu.pending)
		pl.mu.Unlock()
		if n == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("connection never became pending")
		}
		time.Sleep(time.Millisecond)
	}
	pl.Close()
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := c.Read(make([]byte, 1)); !errors.Is(err, io.EOF) {
		t.Fatalf("pending connection after Close: %v", err)
	}
	if _, err := pl.Accept(); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("Accept after Close: %v", err)
	}
}
