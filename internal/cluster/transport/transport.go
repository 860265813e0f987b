// Package transport is the cluster's node-to-node channel: one TCP listener
// and one UDP socket on the same address (--cluster-addr), both bound to the
// cluster's credentials.
//
//   - Every TCP connection is TLS 1.3 with mutual authentication against
//     the cluster CA (credentials.Node.ServerTLS); a connection that fails
//     the handshake (a certificate of another CA, none, plaintext) is closed
//     before any byte of it reaches a service.
//   - The handshake's ALPN protocol says what the connection carries:
//     ProtoRPC ("h2") goes to the gRPC server that serves the services given
//     in Options.Register; ProtoGossip goes to Streams, for memberlist's
//     stream connections (internal/cluster/membership).
//   - UDP datagrams are memberlist's packets, which memberlist itself
//     encrypts and authenticates with the cluster's gossip key (AES-GCM);
//     the transport only carries them (Packets, WritePacket).
//
// Outgoing: Client returns a gRPC connection to a given node, which
// verifies that the server's certificate names that node; DialGossip opens
// a stream connection the same way.
package transport

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"

	"quill/internal/cluster/credentials"
)

// ALPN protocols of the cluster listener.
const (
	ProtoRPC    = "h2"             // gRPC (HTTP/2)
	ProtoGossip = "quill-gossip/1" // memberlist's stream connections
)

// Defaults of Options.
const (
	// DefaultHandshakeTimeout bounds a TLS handshake: a peer on the
	// cluster's network completes one in milliseconds.
	DefaultHandshakeTimeout = 10 * time.Second
	// DefaultMaxHandshakes bounds the handshakes in progress: beyond them,
	// new connections are closed at once, so a flood of connections that
	// never complete costs a bounded number of goroutines.
	DefaultMaxHandshakes = 64
	// maxPacket is the largest UDP payload read; memberlist sends at most
	// its UDPBufferSize (1400 bytes by default).
	maxPacket = 65536
)

// Options configure Listen.
type Options struct {
	// Addr is the host:port to bind, TCP and UDP alike. Port 0 picks a port
	// free for both.
	Addr string
	// Advertise is the host:port other nodes reach this one at; "" means
	// the bound address, which must then name a specific IP.
	Advertise string
	// Node holds this node's ID and certificates.
	Node *credentials.Node
	// Register registers the gRPC services the listener serves.
	Register func(grpc.ServiceRegistrar)

	HandshakeTimeout time.Duration
	MaxHandshakes    int
	Logger           *slog.Logger
	Registerer       prometheus.Registerer // may be nil
}

// Packet is one UDP datagram received.
type Packet struct {
	Buf      []byte
	From     net.Addr
	Received time.Time
}

// Transport is a bound cluster listener. Its methods are safe for
// concurrent use.
type Transport struct {
	opts      Options
	log       *slog.Logger
	tcp       net.Listener
	udp       *net.UDPConn
	advertise netip.AddrPort
	rpc       *connListener
	grpc      *grpc.Server
	streams   chan net.Conn
	packets   chan Packet
	sem       chan struct{}
	metrics   *metrics

	closing   chan struct{}
	ctx       context.Context // cancelled by Shutdown: ends handshakes in progress
	cancel    context.CancelFunc
	closeOnce sync.Once
	wg        sync.WaitGroup

	clients struct {
		sync.Mutex
		m map[string]*grpc.ClientConn // by peer ID and address
	}
}

// Listen binds the TCP listener and the UDP socket and starts serving.
func Listen(opts Options) (*Transport, error) {
	if opts.Node == nil {
		return nil, errors.New("transport: no node credentials")
	}
	if opts.HandshakeTimeout <= 0 {
		opts.HandshakeTimeout = DefaultHandshakeTimeout
	}
	if opts.MaxHandshakes <= 0 {
		opts.MaxHandshakes = DefaultMaxHandshakes
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	tcp, udp, err := bind(opts.Addr)
	if err != nil {
		return nil, err
	}
	t := &Transport{
		opts: opts, log: opts.Logger, tcp: tcp, udp: udp,
		rpc:     newConnListener(tcp.Addr()),
		streams: make(chan net.Conn),
		packets: make(chan Packet, 256),
		sem:     make(chan struct{}, opts.MaxHandshakes),
		closing: make(chan struct{}),
	}
	t.clients.m = map[string]*grpc.ClientConn{}
	t.ctx, t.cancel = context.WithCancel(context.Background())
	if t.advertise, err = advertised(opts.Advertise, tcp.Addr()); err != nil {
		tcp.Close()
		udp.Close()
		t.cancel()
		return nil, err
	}
	if t.metrics, err = newMetrics(opts.Registerer); err != nil {
		tcp.Close()
		udp.Close()
		t.cancel()
		return nil, err
	}
	t.grpc = grpc.NewServer(grpc.Creds(handshaken{}), grpc.InitialWindowSize(rpcWindow), grpc.InitialConnWindowSize(rpcWindow),
		grpc.NumStreamWorkers(rpcWorkers))
	if opts.Register != nil {
		opts.Register(t.grpc)
	}
	t.wg.Add(3)
	go t.acceptLoop()
	go t.readLoop()
	go func() {
		defer t.wg.Done()
		_ = t.grpc.Serve(t.rpc) // returns when rpc is closed
	}()
	return t, nil
}

// bind opens TCP and UDP on one address; with port 0, on one port free for
// both.
func bind(addr string) (net.Listener, *net.UDPConn, error) {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, nil, fmt.Errorf("transport: %q: %w", addr, err)
	}
	for try := 0; ; try++ {
		tcp, err := net.Listen("tcp", addr)
		if err != nil {
			return nil, nil, fmt.Errorf("transport: listening on %s (TCP): %w", addr, err)
		}
		ta := tcp.Addr().(*net.TCPAddr)
		udp, err := net.ListenUDP("udp", &net.UDPAddr{IP: ta.IP, Port: ta.Port, Zone: ta.Zone})
		if err == nil {
			return tcp, udp, nil
		}
		tcp.Close()
		if port != "0" || try == 10 {
			return nil, nil, fmt.Errorf("transport: listening on %s (UDP): %w", net.JoinHostPort(host, fmt.Sprint(ta.Port)), err)
		}
	}
}

// advertised returns the address peers reach this node at: advertise when
// set (its host resolved to one IP), else the bound address.
func advertised(advertise string, bound net.Addr) (netip.AddrPort, error) {
	if advertise == "" {
		ap := bound.(*net.TCPAddr).AddrPort()
		ap = netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())
		if ap.Addr().IsUnspecified() {
			return netip.AddrPort{}, fmt.Errorf("transport: the cluster listener binds every address (%s): give the address other nodes reach it at", bound)
		}
		return ap, nil
	}
	a, err := net.ResolveTCPAddr("tcp", advertise)
	if err != nil {
		return netip.AddrPort{}, fmt.Errorf("transport: advertised address %q: %w", advertise, err)
	}
	ap := a.AddrPort()
	ap = netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())
	if ap.Addr().IsUnspecified() || ap.Port() == 0 {
		return netip.AddrPort{}, fmt.Errorf("transport: advertised address %q is not a reachable host:port", advertise)
	}
	return ap, nil
}

// Addr returns the address other nodes reach this one at.
func (t *Transport) Addr() netip.AddrPort { return t.advertise }

// ID returns this node's ID.
func (t *Transport) ID() string { return t.opts.Node.ID() }

// Streams delivers the gossip stream connections accepted, each a
// *tls.Conn whose handshake completed with a node of the cluster. The
// receiver owns and closes them.
func (t *Transport) Streams() <-chan net.Conn { return t.streams }

// Packets delivers the UDP datagrams received. A receiver must keep up:
// while the channel is full, datagrams wait in the socket's buffer and are
// lost past it, as UDP allows.
func (t *Transport) Packets() <-chan Packet { return t.packets }

// WritePacket sends b as one datagram to addr (host:port, host an IP) and
// returns when it was handed to the kernel.
func (t *Transport) WritePacket(b []byte, addr string) (time.Time, error) {
	ap, err := netip.ParseAddrPort(addr)
	if err != nil {
		ua, rerr := net.ResolveUDPAddr("udp", addr)
		if rerr != nil {
			return time.Time{}, fmt.Errorf("transport: packet to %q: %w", addr, rerr)
		}
		ap = ua.AddrPort()
	}
	_, err = t.udp.WriteToUDPAddrPort(b, ap)
	t.metrics.packetsOut.Inc()
	return time.Now(), err
}

// DialGossip opens a gossip stream connection to addr. When peer is not
// "", the server must prove to be that node; otherwise any node of the
// cluster (a join by address).
func (t *Transport) DialGossip(ctx context.Context, addr, peer string) (net.Conn, error) {
	d := tls.Dialer{Config: t.opts.Node.ClientTLS(peer, []string{ProtoGossip})}
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("transport: gossip stream to %s: %w", addr, err)
	}
	return c, nil
}

// Close stops serving at once: listeners, the UDP socket, every accepted
// and dialled RPC connection. Stream connections already handed out are
// their receivers' to close. It waits for the transport's goroutines.
func (t *Transport) Close() error {
	return t.Shutdown(nil)
}

// Shutdown is Close, but gives RPCs in progress until ctx ends to finish
// (a nil ctx gives them none).
func (t *Transport) Shutdown(ctx context.Context) error {
	t.closeOnce.Do(func() {
		close(t.closing)
		t.cancel()
		t.tcp.Close()
		t.udp.Close()
		t.rpc.Close()
		if ctx == nil {
			t.grpc.Stop()
		} else {
			stopped := make(chan struct{})
			go func() { t.grpc.GracefulStop(); close(stopped) }()
			select {
			case <-stopped:
			case <-ctx.Done():
				t.grpc.Stop()
				<-stopped
			}
		}
		t.clients.Lock()
		for k, c := range t.clients.m {
			c.Close()
			delete(t.clients.m, k)
		}
		t.clients.Unlock()
	})
	t.wg.Wait()
	return nil
}

// acceptLoop accepts TCP connections and hands each to a handshake
// goroutine, while fewer than MaxHandshakes are in progress.
func (t *Transport) acceptLoop() {
	defer t.wg.Done()
	var delay time.Duration
	for {
		c, err := t.tcp.Accept()
		if err != nil {
			select {
			case <-t.closing:
				return
			default:
			}
			// A temporary failure (out of file descriptors): back off.
			delay = min(max(2*delay, 5*time.Millisecond), time.Second)
			t.log.Warn("cluster listener: accept failed", "err", err, "retry_in", delay)
			select {
			case <-time.After(delay):
			case <-t.closing:
				return
			}
			continue
		}
		delay = 0
		select {
		case t.sem <- struct{}{}:
		default:
			t.metrics.refused.WithLabelValues("busy").Inc()
			c.Close()
			continue
		}
		t.wg.Add(1)
		go func() {
			defer t.wg.Done()
			t.handle(c)
		}()
	}
}

// handle completes the TLS handshake of c and routes it by ALPN protocol.
func (t *Transport) handle(c net.Conn) {
	tc := tls.Server(c, t.opts.Node.ServerTLS([]string{ProtoRPC, ProtoGossip}))
	// The context's end (the timeout, or Shutdown) interrupts the handshake.
	ctx, cancel := context.WithTimeout(t.ctx, t.opts.HandshakeTimeout)
	err := tc.HandshakeContext(ctx)
	cancel()
	<-t.sem
	if err != nil {
		t.metrics.refused.WithLabelValues("handshake").Inc()
		t.log.Warn("cluster listener: connection refused", "remote", c.RemoteAddr().String(), "err", err)
		c.Close()
		return
	}
	switch proto := tc.ConnectionState().NegotiatedProtocol; proto {
	case ProtoRPC:
		t.metrics.accepted.WithLabelValues("rpc").Inc()
		if !t.rpc.put(tc) {
			tc.Close()
		}
	case ProtoGossip:
		t.metrics.accepted.WithLabelValues("gossip").Inc()
		select {
		case t.streams <- tc:
		case <-t.closing:
			tc.Close()
		}
	default:
		// Unreachable: the server offers only these two and refuses a
		// client that offers neither.
		t.metrics.refused.WithLabelValues("protocol").Inc()
		tc.Close()
	}
}

// readLoop reads UDP datagrams into Packets until the socket closes.
func (t *Transport) readLoop() {
	defer t.wg.Done()
	for {
		buf := make([]byte, maxPacket)
		n, from, err := t.udp.ReadFromUDPAddrPort(buf)
		now := time.Now()
		if err != nil {
			select {
			case <-t.closing:
				return
			default:
			}
			if errors.Is(err, net.ErrClosed) {
				return
			}
			t.log.Warn("cluster listener: reading UDP", "err", err)
			continue
		}
		if n == 0 {
			continue
		}
		t.metrics.packetsIn.Inc()
		p := Packet{Buf: buf[:n:n], From: net.UDPAddrFromAddrPort(from), Received: now}
		select {
		case t.packets <- p:
		case <-t.closing:
			return
		}
	}
}
