package textconn

import (
	"net/netip"
	"sync"
)

// Limiter bounds connections per remote address and in total, and refuses
// every new connection while the node is overloaded (ShedWhen). One
// Limiter is shared by every listener of a node. IPv6 peers are counted
// per /64, the smallest prefix a single host is usually given, so that one
// host cannot evade the limit by rotating addresses. A nil *Limiter admits
// everything. It is safe for concurrent use.
type Limiter struct {
	perIP, total int
	overload     Overload // nil: never overloaded

	mu struct {
		sync.Mutex
		n    int
		byIP map[netip.Addr]int
	}
}

// NewLimiter returns a Limiter admitting at most perIP connections from one
// address and total connections in all; a value <= 0 means no limit.
func NewLimiter(perIP, total int) *Limiter {
	l := &Limiter{perIP: perIP, total: total}
	l.mu.byIP = make(map[netip.Addr]int)
	return l
}

// Overload says whether the node is overloaded now (load.Monitor).
type Overload interface{ Overloaded() bool }

// ShedWhen makes the Limiter refuse new connections while o reports the
// node overloaded. It must be called before the Limiter is used.
func (l *Limiter) ShedWhen(o Overload) { l.overload = o }

// refusal says why acquire did not admit a connection.
type refusal uint8

const (
	admitted refusal = iota
	overLimit
	overloaded
)

// Acquire admits one connection from ip. When ok, release must be called
// exactly once when the connection ends (further calls are no-ops).
func (l *Limiter) Acquire(ip netip.Addr) (release func(), ok bool) {
	if l == nil {
		return func() {}, true
	}
	t, r := l.acquire(ip)
	if r != admitted {
		return nil, false
	}
	var once sync.Once
	return func() { once.Do(func() { l.release(t) }) }, true
}

// ticket is an admitted connection's place in the Limiter's counts.
type ticket struct {
	key   netip.Addr
	perIP bool // counted against key as well as the total
}

// acquire is Acquire without the release closure: the Server keeps the
// ticket and calls release with it exactly once.
func (l *Limiter) acquire(ip netip.Addr) (ticket, refusal) {
	if l == nil {
		return ticket{}, admitted
	}
	if l.overload != nil && l.overload.Overloaded() {
		return ticket{}, overloaded
	}
	key := PeerKey(ip)
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.total > 0 && l.mu.n >= l.total {
		return ticket{}, overLimit
	}
	// Peers without an IP (unix sockets) count only against the total.
	perIP := ip.IsValid()
	if perIP && l.perIP > 0 && l.mu.byIP[key] >= l.perIP {
		return ticket{}, overLimit
	}
	l.mu.n++
	if perIP {
		l.mu.byIP[key]++
	}
	return ticket{key: key, perIP: perIP}, admitted
}

// Active returns the number of connections admitted and not yet released
// (0 for a nil Limiter).
func (l *Limiter) Active() int {
	if l == nil {
		return 0
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.mu.n
}

// release gives back what acquire took; a nil Limiter has nothing.
func (l *Limiter) release(t ticket) {
	if l == nil {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.mu.n--
	if !t.perIP {
		return
	}
	if c := l.mu.byIP[t.key] - 1; c > 0 {
		l.mu.byIP[t.key] = c
	} else {
		delete(l.mu.byIP, t.key)
	}
}

// PeerKey is the unit in which a remote peer is counted, by the Limiter
// and by the authentication throttle: the address itself for IPv4 (mapped
// addresses unmapped), its /64 for IPv6.
func PeerKey(ip netip.Addr) netip.Addr {
	ip = ip.Unmap()
	if ip.Is6() {
		if p, err := ip.Prefix(64); err == nil {
			return p.Addr()
		}
	}
	return ip
}
