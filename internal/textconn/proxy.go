package textconn

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"time"
)

// ProxyListener accepts connections from proxies that speak the HAProxy
// PROXY protocol (version 1, text, and version 2, binary; "The PROXY
// protocol", haproxy.org, 2020) and returns them with the client's
// address, from the header, as RemoteAddr, so that the connection limiter,
// the authentication throttle, logs and trace fields all see the client
// rather than the proxy.
//
// Contract: a peer outside Trusted is closed at once, unread; a trusted
// peer must send a valid header within Timeout or it is closed. Headers
// are read in a goroutine per connection, never in Accept, so a slow proxy
// cannot stall the accept loop. A LOCAL (v2) or UNKNOWN (v1) header, which
// a proxy sends for its own health checks, keeps the proxy's address. The
// header is read exactly, byte for byte, so nothing after it is consumed
// and the connection is returned unwrapped but for its addresses.
type ProxyListener struct {
	ln      net.Listener
	trusted []netip.Prefix
	timeout time.Duration
	log     *slog.Logger

	conns chan acceptResult
	done  chan struct{}
	once  sync.Once
	mu    struct {
		sync.Mutex
		pending map[net.Conn]struct{} // reading a header
	}
}

type acceptResult struct {
	nc  net.Conn
	err error
}

// NewProxyListener wraps ln, accepting headers only from the trusted
// networks, each within timeout, and starts accepting.
func NewProxyListener(ln net.Listener, trusted []netip.Prefix, timeout time.Duration, log *slog.Logger) *ProxyListener {
	if log == nil {
		log = slog.Default()
	}
	l := &ProxyListener{ln: ln, trusted: trusted, timeout: timeout, log: log,
		conns: make(chan acceptResult), done: make(chan struct{})}
	l.mu.pending = make(map[net.Conn]struct{})
	go l.run()
	return l
}

// Accept returns the next connection whose header has been read.
func (l *ProxyListener) Accept() (net.Conn, error) {
	select {
	case r := <-l.conns:
		return r.nc, r.err
	case <-l.done:
		return nil, net.ErrClosed
	}
}

// Close stops accepting and closes connections still sending a header.
func (l *ProxyListener) Close() error {
	var err error
	l.once.Do(func() {
		close(l.done)
		err = l.ln.Close()
		l.mu.Lock()
		for nc := range l.mu.pending {
			nc.Close()
		}
		l.mu.Unlock()
	})
	return err
}

// Addr is the listening address.
func (l *ProxyListener) Addr() net.Addr { return l.ln.Addr() }

func (l *ProxyListener) run() {
	for {
		nc, err := l.ln.Accept()
		if err != nil {
			// Temporary errors go to the caller, whose accept loop backs
			// off; a permanent one ends this loop too.
			var ne net.Error
			temporary := errors.As(err, &ne) && ne.Timeout() || errors.Is(err, errTooManyFiles)
			select {
			case l.conns <- acceptResult{err: err}:
			case <-l.done:
				return
			}
			if !temporary {
				return
			}
			continue
		}
		peer := addrPort(nc.RemoteAddr()).Addr()
		if !l.isTrusted(peer) {
			l.log.Warn("PROXY protocol: connection from an untrusted peer refused", "peer", peer)
			nc.Close()
			continue
		}
		l.mu.Lock()
		select {
		case <-l.done:
			l.mu.Unlock()
			nc.Close()
			return
		default:
		}
		l.mu.pending[nc] = struct{}{}
		l.mu.Unlock()
		go l.handshake(nc)
	}
}

func (l *ProxyListener) isTrusted(peer netip.Addr) bool {
	for _, p := range l.trusted {
		if p.Contains(peer) {
			return true
		}
	}
	return false
}

func (l *ProxyListener) handshake(nc net.Conn) {
	_ = nc.SetReadDeadline(time.Now().Add(l.timeout))
	h, err := ReadProxyHeader(nc)
	_ = nc.SetReadDeadline(time.Time{})
	l.mu.Lock()
	delete(l.mu.pending, nc)
	l.mu.Unlock()
	if err != nil {
		l.log.Warn("PROXY protocol: bad header; connection closed", "peer", nc.RemoteAddr().String(), "err", err)
		nc.Close()
		return
	}
	out := nc
	if h.Source.IsValid() {
		out = &proxiedConn{Conn: nc, remote: net.TCPAddrFromAddrPort(h.Source)}
	}
	select {
	case l.conns <- acceptResult{nc: out}:
	case <-l.done:
		nc.Close()
	}
}

// proxiedConn is a connection whose peer is the client named by a PROXY
// header.
type proxiedConn struct {
	net.Conn
	remote net.Addr
}

func (c *proxiedConn) RemoteAddr() net.Addr { return c.remote }

// ProxyHeader is a parsed PROXY protocol header. Source is the client's
// address; it is the zero value for a LOCAL or UNKNOWN header, or one for
// an address family that is not TCP over IP.
type ProxyHeader struct {
	Source, Destination netip.AddrPort
}

// Bounds on a header: 107 bytes for v1 (section 2.1); for v2 the 16-byte
// fixed part and an address block of at most maxV2Block bytes, ample for
// the addresses and the TLVs proxies send.
const (
	maxV1Header = 107
	maxV2Block  = 2048
)

var (
	v2Signature = []byte("\r\n\r\n\x00\r\nQUIT\n")
	// ErrProxyHeader: the connection did not start with a valid PROXY
	// protocol header.
	ErrProxyHeader = errors.New("textconn: malformed PROXY protocol header")
)

// ReadProxyHeader reads one PROXY protocol header (v1 or v2) from r and
// nothing more.
func ReadProxyHeader(r io.Reader) (ProxyHeader, error) {
	var start [8]byte
	if _, err := io.ReadFull(r, start[:]); err != nil {
		return ProxyHeader{}, err
	}
	switch {
	case bytes.HasPrefix(start[:], []byte("PROXY ")):
		return readV1(r, start[:])
	case bytes.Equal(start[:], v2Signature[:8]):
		return readV2(r)
	}
	return ProxyHeader{}, fmt.Errorf("%w: no signature", ErrProxyHeader)
}

// readV1 reads the rest of a v1 line one byte at a time (so as not to read
// past it) and parses "PROXY TCP4|TCP6 src dst sport dport" or
// "PROXY UNKNOWN ...".
func readV1(r io.Reader, start []byte) (ProxyHeader, error) {
	line := make([]byte, len(start), maxV1Header)
	copy(line, start)
	var b [1]byte
	for !bytes.HasSuffix(line, []byte("\r\n")) {
		if len(line) == maxV1Header {
			return ProxyHeader{}, fmt.Errorf("%w: v1 line longer than %d bytes", ErrProxyHeader, maxV1Header)
		}
		if _, err := io.ReadFull(r, b[:]); err != nil {
			return ProxyHeader{}, err
		}
		line = append(line, b[0])
	}
	f := strings.Split(string(line[:len(line)-2]), " ")
	if len(f) >= 2 && f[1] == "UNKNOWN" {
		return ProxyHeader{}, nil
	}
	if len(f) != 6 || (f[1] != "TCP4" && f[1] != "TCP6") {
		return ProxyHeader{}, fmt.Errorf("%w: v1 line %q", ErrProxyHeader, line)
	}
	src, err1 := netip.ParseAddr(f[2])
	dst, err2 := netip.ParseAddr(f[3])
	sport, err3 := parsePort(f[4])
	dport, err4 := parsePort(f[5])
	if err := errors.Join(err1, err2, err3, err4); err != nil ||
		src.Is4() != (f[1] == "TCP4") || dst.Is4() != (f[1] == "TCP4") || src.Zone() != "" || dst.Zone() != "" {
		return ProxyHeader{}, fmt.Errorf("%w: v1 line %q", ErrProxyHeader, line)
	}
	return ProxyHeader{Source: netip.AddrPortFrom(src, sport), Destination: netip.AddrPortFrom(dst, dport)}, nil
}

// parsePort parses a decimal port without sign or leading zeros.
func parsePort(s string) (uint16, error) {
	n, err := strconv.ParseUint(s, 10, 16)
	if err != nil || (len(s) > 1 && s[0] == '0') {
		return 0, ErrProxyHeader
	}
	return uint16(n), nil
}

// readV2 reads the rest of a v2 header after the first 8 signature bytes.
func readV2(r io.Reader) (ProxyHeader, error) {
	var fixed [8]byte // signature[8:12], version/command, family, length
	if _, err := io.ReadFull(r, fixed[:]); err != nil {
		return ProxyHeader{}, err
	}
	if !bytes.Equal(fixed[:4], v2Signature[8:]) {
		return ProxyHeader{}, fmt.Errorf("%w: bad v2 signature", ErrProxyHeader)
	}
	verCmd, fam := fixed[4], fixed[5]
	n := int(binary.BigEndian.Uint16(fixed[6:8]))
	if verCmd>>4 != 2 {
		return ProxyHeader{}, fmt.Errorf("%w: version %d", ErrProxyHeader, verCmd>>4)
	}
	if n > maxV2Block {
		return ProxyHeader{}, fmt.Errorf("%w: v2 block of %d bytes", ErrProxyHeader, n)
	}
	block := make([]byte, n)
	if _, err := io.ReadFull(r, block); err != nil {
		return ProxyHeader{}, err
	}
	switch verCmd & 0xf {
	case 0: // LOCAL: the proxy's own connection; the block is ignored.
		return ProxyHeader{}, nil
	case 1: // PROXY
	default:
		return ProxyHeader{}, fmt.Errorf("%w: command %d", ErrProxyHeader, verCmd&0xf)
	}
	switch fam {
	case 0x11: // TCP over IPv4
		if n < 12 {
			return ProxyHeader{}, fmt.Errorf("%w: short IPv4 block", ErrProxyHeader)
		}
		src := netip.AddrFrom4([4]byte(block[0:4]))
		dst := netip.AddrFrom4([4]byte(block[4:8]))
		return ProxyHeader{
			Source:      netip.AddrPortFrom(src, binary.BigEndian.Uint16(block[8:10])),
			Destination: netip.AddrPortFrom(dst, binary.BigEndian.Uint16(block[10:12])),
		}, nil
	case 0x21: // TCP over IPv6
		if n < 36 {
			return ProxyHeader{}, fmt.Errorf("%w: short IPv6 block", ErrProxyHeader)
		}
		src := netip.AddrFrom16([16]byte(block[0:16])).Unmap()
		dst := netip.AddrFrom16([16]byte(block[16:32])).Unmap()
		return ProxyHeader{
			Source:      netip.AddrPortFrom(src, binary.BigEndian.Uint16(block[32:34])),
			Destination: netip.AddrPortFrom(dst, binary.BigEndian.Uint16(block[34:36])),
		}, nil
	case 0x00, 0x31: // UNSPEC, or a unix socket: no client IP to take.
		return ProxyHeader{}, nil
	}
	return ProxyHeader{}, fmt.Errorf("%w: family 0x%02x is not TCP", ErrProxyHeader, fam)
}
