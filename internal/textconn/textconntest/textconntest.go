// Package textconntest provides what protocol front ends' tests need to
// observe the wire beneath a textconn.Conn.
package textconntest

import (
	"net"
	"sync/atomic"
)

// WriteCountingListener counts the Write calls on every connection it
// accepts: each is one network write (a send(2) on TCP), so a test can
// check how a server's replies are batched (PIPELINING, RFC 2920 and
// RFC 2449 section 6.6).
type WriteCountingListener struct {
	net.Listener
	writes atomic.Int64
}

// Writes returns the writes on all accepted connections so far.
func (l *WriteCountingListener) Writes() int64 { return l.writes.Load() }

func (l *WriteCountingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return writeCountingConn{c, &l.writes}, nil
}

type writeCountingConn struct {
	net.Conn
	writes *atomic.Int64
}

func (c writeCountingConn) Write(p []byte) (int, error) {
	c.writes.Add(1)
	return c.Conn.Write(p)
}
