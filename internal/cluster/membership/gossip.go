package membership

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/memberlist"

	"quill/internal/cluster/transport"
)

// gossipTransport is memberlist's Transport over the cluster transport:
// packets over its UDP socket, stream connections over its TLS listener
// (ALPN transport.ProtoGossip), dialled to the named node when memberlist
// knows the name. It does not own the cluster transport: its Shutdown,
// which memberlist calls, only stops its own pump.
type gossipTransport struct {
	t       *transport.Transport
	packets chan *memberlist.Packet
	stop    chan struct{}
	once    sync.Once
	wg      sync.WaitGroup
	// cut, when set, names the addresses this node cannot reach nor hear
	// from: the tests' partitions (see cutOff). Nil in service.
	cut atomic.Pointer[map[string]bool]
}

// cutOff makes the addresses in addrs unreachable both ways, as a
// partition would: packets to and from them are dropped and stream dials
// to them fail. An empty addrs heals. Tests cut both sides of a link, so
// that streams the other side would open fail at its dial.
func (g *gossipTransport) cutOff(addrs ...string) {
	if len(addrs) == 0 {
		g.cut.Store(nil)
		return
	}
	m := make(map[string]bool, len(addrs))
	for _, a := range addrs {
		m[a] = true
	}
	g.cut.Store(&m)
}

func (g *gossipTransport) isCut(addr string) bool {
	m := g.cut.Load()
	return m != nil && (*m)[addr]
}

var _ memberlist.NodeAwareTransport = (*gossipTransport)(nil)

func newGossipTransport(t *transport.Transport) *gossipTransport {
	g := &gossipTransport{t: t, packets: make(chan *memberlist.Packet), stop: make(chan struct{})}
	g.wg.Add(1)
	go g.pump()
	return g
}

// pump moves the transport's datagrams to memberlist's channel.
func (g *gossipTransport) pump() {
	defer g.wg.Done()
	for {
		select {
		case p := <-g.t.Packets():
			if p.From != nil && g.isCut(p.From.String()) {
				continue
			}
			select {
			case g.packets <- &memberlist.Packet{Buf: p.Buf, From: p.From, Timestamp: p.Received}:
			case <-g.stop:
				return
			}
		case <-g.stop:
			return
		}
	}
}

func (g *gossipTransport) FinalAdvertiseAddr(string, int) (net.IP, int, error) {
	ap := g.t.Addr()
	return net.IP(ap.Addr().AsSlice()), int(ap.Port()), nil
}

func (g *gossipTransport) WriteTo(b []byte, addr string) (time.Time, error) {
	if g.isCut(addr) {
		return time.Now(), nil // lost on the way, as UDP may lose it
	}
	return g.t.WritePacket(b, addr)
}

func (g *gossipTransport) WriteToAddress(b []byte, a memberlist.Address) (time.Time, error) {
	return g.WriteTo(b, a.Addr)
}

func (g *gossipTransport) PacketCh() <-chan *memberlist.Packet { return g.packets }

func (g *gossipTransport) DialTimeout(addr string, timeout time.Duration) (net.Conn, error) {
	return g.DialAddressTimeout(memberlist.Address{Addr: addr}, timeout)
}

// DialAddressTimeout dials a stream connection; with a.Name set (memberlist
// knows the node), the server must prove to be that node.
func (g *gossipTransport) DialAddressTimeout(a memberlist.Address, timeout time.Duration) (net.Conn, error) {
	if g.isCut(a.Addr) {
		return nil, fmt.Errorf("dial %s: cut off", a.Addr)
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	return g.t.DialGossip(ctx, a.Addr, a.Name)
}

func (g *gossipTransport) StreamCh() <-chan net.Conn { return g.t.Streams() }

func (g *gossipTransport) Shutdown() error {
	g.once.Do(func() { close(g.stop) })
	g.wg.Wait()
	return nil
}

// logWriter turns memberlist's log lines ("[WARN] memberlist: ...") into
// records of log at their level.
type logWriter struct{ log *slog.Logger }

func (w logWriter) Write(p []byte) (int, error) {
	line := bytes.TrimSpace(p)
	level := slog.LevelInfo
	for prefix, l := range map[string]slog.Level{"[DEBUG]": slog.LevelDebug, "[INFO]": slog.LevelInfo, "[WARN]": slog.LevelWarn, "[ERR]": slog.LevelError} {
		if rest, ok := bytes.CutPrefix(line, []byte(prefix)); ok {
			level, line = l, bytes.TrimSpace(rest)
			break
		}
	}
	line = bytes.TrimPrefix(line, []byte("memberlist: "))
	w.log.Log(context.Background(), level, string(line))
	return len(p), nil
}
