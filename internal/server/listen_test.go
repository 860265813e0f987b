package server

import (
	"net"
	"syscall"
	"testing"
)

// TestListenKeepAlive: connections accepted by a listener without
// keepAlive have no TCP keep-alive (four setsockopt calls saved per
// connection); with it, they have keep-alive, as IMAP needs.
func TestListenKeepAlive(t *testing.T) {
	for _, keepAlive := range []bool{false, true} {
		ln, err := listen("tcp", "127.0.0.1:0", keepAlive)
		if err != nil {
			t.Fatal(err)
		}
		c, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			ln.Close()
			t.Fatal(err)
		}
		sc, err := ln.Accept()
		c.Close()
		ln.Close()
		if err != nil {
			t.Fatal(err)
		}
		raw, err := sc.(*net.TCPConn).SyscallConn()
		if err != nil {
			t.Fatal(err)
		}
		var on int
		var serr error
		if err := raw.Control(func(fd uintptr) { on, serr = syscall.GetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_KEEPALIVE) }); err != nil {
			t.Fatal(err)
		}
		sc.Close()
		if serr != nil {
			t.Fatal(serr)
		}
		if (on != 0) != keepAlive {
			t.Errorf("listen(keepAlive=%v): accepted connection has SO_KEEPALIVE=%d", keepAlive, on)
		}
	}
}
