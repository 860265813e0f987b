package transport

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"quill/internal/cluster/clusterpb"
	"quill/internal/cluster/credentials"
)

// whoami is the Node service as a test serves it: Status names the peer
// that called, as the transport authenticated it.
type whoami struct {
	clusterpb.UnimplementedNodeServer
	id string
}

func (w whoami) Status(ctx context.Context, _ *clusterpb.StatusRequest) (*clusterpb.StatusReply, error) {
	peer, _ := PeerNode(ctx)
	return &clusterpb.StatusReply{NodeId: w.id, State: "called by " + peer}, nil
}

type node struct {
	*Transport
	creds *credentials.Node
	reg   *prometheus.Registry
}

func start(t *testing.T, rec *credentials.Record, opts Options) *node {
	t.Helper()
	creds, err := rec.ForNode(credentials.NewNodeID(), credentials.NodeOptions{})
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	if opts.Addr == "" {
		opts.Addr = "127.0.0.1:0"
	}
	opts.Node, opts.Registerer = creds, reg
	opts.Register = func(r grpc.ServiceRegistrar) { clusterpb.RegisterNodeServer(r, whoami{id: creds.ID()}) }
	tr, err := Listen(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tr.Close() })
	return &node{tr, creds, reg}
}

func newRecord(t *testing.T) *credentials.Record {
	t.Helper()
	rec, err := credentials.Generate(time.Now())
	if err != nil {
		t.Fatal(err)
	}
	return rec
}

func status(t *testing.T, from *node, to *node, wantID string) (*clusterpb.StatusReply, error) {
	t.Helper()
	cc, err := from.Client(wantID, to.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return clusterpb.NewNodeClient(cc).Status(ctx, &clusterpb.StatusRequest{})
}

func refused(n *node, reason string) float64 {
	return testutil.ToFloat64(n.metrics.refused.WithLabelValues(reason))
}

func TestRPCBetweenNodes(t *testing.T) {
	rec := newRecord(t)
	a, b := start(t, rec, Options{}), start(t, rec, Options{})
	reply, err := status(t, b, a, a.ID())
	if err != nil {
		t.Fatalf("Status: %v", err)
	}
	if reply.NodeId != a.ID() || reply.State != "called by "+b.ID() {
		t.Fatalf("Status = %v; want node %s called by %s", reply, a.ID(), b.ID())
	}
	if got := testutil.ToFloat64(a.metrics.accepted.WithLabelValues("rpc")); got != 1 {
		t.Fatalf("accepted rpc connections = %v, want 1", got)
	}
	// The client connection is shared.
	c1, _ := b.Client(a.ID(), a.Addr().String())
	c2, _ := b.Client(a.ID(), a.Addr().String())
	if c1 != c2 {
		t.Fatal("Client made two connections to one peer")
	}
	b.Forget(a.ID())
	if c3, _ := b.Client(a.ID(), a.Addr().String()); c3 == c1 {
		t.Fatal("Forget kept the connection")
	}
}

// TestRefusesStrangers: a node of another CA, a client without a
// certificate, a plaintext client, and a server that is not the node
// dialled are all refused, and nothing of theirs reaches a service.
func TestRefusesStrangers(t *testing.T) {
	rec := newRecord(t)
	a, b := start(t, rec, Options{}), start(t, rec, Options{})
	stranger := start(t, newRecord(t), Options{})

	t.Run("node of another CA", func(t *testing.T) {
		before := refused(a, "handshake")
		if _, err := status(t, stranger, a, a.ID()); err == nil {
			t.Fatal("a node of another CA called Status")
		}
		if _, err := status(t, a, stranger, stranger.ID()); err == nil {
			t.Fatal("a node called Status on a server of another CA")
		}
		waitFor(t, "refusal counted", func() bool { return refused(a, "handshake") > before })
	})
	t.Run("client without certificate", func(t *testing.T) {
		before := refused(a, "handshake")
		cfg := b.creds.ClientTLS(a.ID(), []string{ProtoRPC})
		cfg.GetClientCertificate = nil
		c, err := tls.Dial("tcp", a.Addr().String(), cfg)
		if err == nil {
			c.SetDeadline(time.Now().Add(5 * time.Second))
			_, err = c.Read(make([]byte, 1)) // TLS 1.3: the refusal arrives after the client's handshake
			c.Close()
		}
		if err == nil {
			t.Fatal("a client without a certificate was served")
		}
		waitFor(t, "refusal counted", func() bool { return refused(a, "handshake") > before })
	})
	t.Run("plaintext gRPC", func(t *testing.T) {
		before := refused(a, "handshake")
		cc, err := grpc.NewClient("passthrough:///"+a.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		defer cc.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		if _, err := clusterpb.NewNodeClient(cc).Status(ctx, &clusterpb.StatusRequest{}); err == nil {
			t.Fatal("a plaintext gRPC client was served")
		}
		waitFor(t, "refusal counted", func() bool { return refused(a, "handshake") > before })
	})
	t.Run("plaintext bytes", func(t *testing.T) {
		before := refused(a, "handshake")
		c, err := net.Dial("tcp", a.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(5 * time.Second))
		c.Write([]byte("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"))
		// The server closes the connection; all it may send is a TLS
		// alert record (5 bytes of header, 2 of alert).
		n, _ := io.Copy(io.Discard, c)
		if n > 7 {
			t.Fatalf("a plaintext client got %d bytes", n)
		}
		waitFor(t, "refusal counted", func() bool { return refused(a, "handshake") > before })
	})
	t.Run("server other than dialled", func(t *testing.T) {
		if _, err := status(t, b, a, b.ID()); err == nil {
			t.Fatal("the client accepted a server naming another node")
		}
		if _, err := b.DialGossip(context.Background(), a.Addr().String(), credentials.NewNodeID()); !errors.Is(err, credentials.ErrPeer) {
			t.Fatalf("DialGossip to the wrong node = %v, want ErrPeer", err)
		}
	})
}

func TestGossipStreamsAndPackets(t *testing.T) {
	rec := newRecord(t)
	a, b := start(t, rec, Options{}), start(t, rec, Options{})

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := b.DialGossip(ctx, a.Addr().String(), a.ID())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	go c.Write([]byte("push-pull"))
	var got net.Conn
	select {
	case got = <-a.Streams():
	case <-ctx.Done():
		t.Fatal("no stream accepted")
	}
	defer got.Close()
	buf := make([]byte, 9)
	got.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.ReadFull(got, buf); err != nil || string(buf) != "push-pull" {
		t.Fatalf("stream read %q, %v", buf, err)
	}
	if id, err := credentials.PeerID(got.(*tls.Conn).ConnectionState().PeerCertificates[0]); err != nil || id != b.ID() {
		t.Fatalf("stream peer = %q, %v; want %s", id, err, b.ID())
	}

	payload := []byte("a gossip datagram")
	if _, err := b.WritePacket(payload, a.Addr().String()); err != nil {
		t.Fatal(err)
	}
	select {
	case p := <-a.Packets():
		if !bytes.Equal(p.Buf, payload) || p.From.String() != b.Addr().String() {
			t.Fatalf("packet %q from %s; want %q from %s", p.Buf, p.From, payload, b.Addr())
		}
	case <-ctx.Done():
		t.Fatal("no packet received")
	}
}

// TestHandshakeTimeout: a connection that never completes its handshake
// is closed after the timeout.
func TestHandshakeTimeout(t *testing.T) {
	a := start(t, newRecord(t), Options{HandshakeTimeout: 200 * time.Millisecond})
	c, err := net.Dial("tcp", a.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	start := time.Now()
	if _, err := c.Read(make([]byte, 1)); err == nil {
		t.Fatal("read data from a silent connection")
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("silent connection closed after %v", d)
	}
	waitFor(t, "refusal counted", func() bool { return refused(a, "handshake") == 1 })
}

func TestListenAddresses(t *testing.T) {
	rec := newRecord(t)
	creds, _ := rec.ForNode(credentials.NewNodeID(), credentials.NodeOptions{})
	if _, err := Listen(Options{Addr: "0.0.0.0:0", Node: creds}); err == nil {
		t.Fatal("Listen on every address without an advertised one succeeded")
	}
	tr, err := Listen(Options{Addr: "0.0.0.0:0", Advertise: "127.0.0.1:7946", Node: creds})
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	if tr.Addr().String() != "127.0.0.1:7946" {
		t.Fatalf("Addr = %s, want the advertised one", tr.Addr())
	}
	// The same port is taken: a second Listen on it fails.
	a := start(t, rec, Options{})
	if _, err := Listen(Options{Addr: a.Addr().String(), Node: creds}); err == nil {
		t.Fatal("two transports bound one address")
	}
	// Closed: no new clients.
	a.Close()
	if _, err := a.Client(a.ID(), a.Addr().String()); err == nil {
		t.Fatal("Client after Close succeeded")
	}
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within 10s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
