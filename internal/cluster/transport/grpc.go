package transport

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"sync"

	"google.golang.org/grpc"
	grpccreds "google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"

	"quill/internal/cluster/credentials"
)

// Client returns a gRPC connection to node peer at addr (host:port),
// shared by every caller until Forget or Close. The connection dials
// lazily and redials after failures; each handshake requires the server to
// prove it is peer.
func (t *Transport) Client(peer, addr string) (*grpc.ClientConn, error) {
	key := peer + "@" + addr
	t.clients.Lock()
	defer t.clients.Unlock()
	select {
	case <-t.closing:
		return nil, net.ErrClosed
	default:
	}
	if c, ok := t.clients.m[key]; ok {
		return c, nil
	}
	c, err := grpc.NewClient("passthrough:///"+addr,
		grpc.WithTransportCredentials(grpccreds.NewTLS(t.opts.Node.ClientTLS(peer, []string{ProtoRPC}))),
		grpc.WithInitialWindowSize(rpcWindow), grpc.WithInitialConnWindowSize(rpcWindow))
	if err != nil {
		return nil, fmt.Errorf("transport: RPC client for %s at %s: %w", peer, addr, err)
	}
	t.clients.m[key] = c
	return c, nil
}

// rpcWindow is the HTTP/2 flow-control window of every RPC connection and
// stream, both ways. The messages are small (forwarded metadata, events);
// a fixed window that large also turns off gRPC's bandwidth-delay
// estimation, whose PING frames would cost a write and a read on each side
// for many of the calls at the rates a node forwards.
const rpcWindow = 1 << 20

// rpcWorkers is how many goroutines serve RPCs and wait for the next
// instead of exiting; a call beyond them gets a goroutine of its own. A
// handler's stack grows to write a batch to the store, and a new goroutine
// per call grew it anew every time (runtime.newstack, about 2% of a
// forwarding node's CPU); a waiting worker keeps what the collector leaves
// of it.
const rpcWorkers = 32

// Forget closes the RPC connections to peer (a node that died or left).
func (t *Transport) Forget(peer string) {
	t.clients.Lock()
	defer t.clients.Unlock()
	for k, c := range t.clients.m {
		if len(k) > len(peer) && k[:len(peer)] == peer && k[len(peer)] == '@' {
			c.Close()
			delete(t.clients.m, k)
		}
	}
}

// PeerNode returns the node ID of the peer of an RPC served by the
// transport's gRPC server (from its verified client certificate).
func PeerNode(ctx context.Context) (string, bool) {
	p, ok := peer.FromContext(ctx)
	if !ok {
		return "", false
	}
	info, ok := p.AuthInfo.(grpccreds.TLSInfo)
	if !ok || len(info.State.PeerCertificates) == 0 {
		return "", false
	}
	id, err := credentials.PeerID(info.State.PeerCertificates[0])
	return id, err == nil
}

// handshaken is the gRPC server's TransportCredentials: the connections
// it serves completed their TLS handshake in the transport (which chose
// them by ALPN), so its ServerHandshake only reports that handshake's
// state, from which handlers learn their peer (PeerNode).
type handshaken struct{}

var _ grpccreds.TransportCredentials = handshaken{}

func (handshaken) ServerHandshake(c net.Conn) (net.Conn, grpccreds.AuthInfo, error) {
	tc, ok := c.(*tls.Conn)
	if !ok {
		return nil, nil, fmt.Errorf("transport: %T is not a TLS connection", c)
	}
	return tc, grpccreds.TLSInfo{
		State:          tc.ConnectionState(),
		CommonAuthInfo: grpccreds.CommonAuthInfo{SecurityLevel: grpccreds.PrivacyAndIntegrity},
	}, nil
}

func (handshaken) ClientHandshake(context.Context, string, net.Conn) (net.Conn, grpccreds.AuthInfo, error) {
	return nil, nil, errors.New("transport: server-side credentials")
}

func (handshaken) Info() grpccreds.ProtocolInfo {
	return grpccreds.ProtocolInfo{SecurityProtocol: "tls", SecurityVersion: "1.3"}
}

func (h handshaken) Clone() grpccreds.TransportCredentials { return h }
func (handshaken) OverrideServerName(string) error         { return nil }

// connListener is the net.Listener the gRPC server serves: it yields the
// connections the transport routed to it.
type connListener struct {
	addr   net.Addr
	conns  chan net.Conn
	closed chan struct{}
	once   sync.Once
}

func newConnListener(addr net.Addr) *connListener {
	return &connListener{addr: addr, conns: make(chan net.Conn), closed: make(chan struct{})}
}

// put hands c to Accept; false once the listener is closed.
func (l *connListener) put(c net.Conn) bool {
	select {
	case l.conns <- c:
		return true
	case <-l.closed:
		return false
	}
}

func (l *connListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.conns:
		return c, nil
	case <-l.closed:
		return nil, net.ErrClosed
	}
}

func (l *connListener) Close() error {
	l.once.Do(func() { close(l.closed) })
	return nil
}

func (l *connListener) Addr() net.Addr { return l.addr }
