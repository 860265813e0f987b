package auth

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"quill/internal/store"
	"quill/internal/store/embedded"
)

// fastKDF keeps tests quick; production hashes use DefaultKDF.
var fastKDF = KDFParams{MemoryKiB: 64, Time: 1, Threads: 1}

func TestPasswordHash(t *testing.T) {
	h, err := HashPassword("correct horse", fastKDF)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(h, "$argon2id$v=19$m=64,t=1,p=1$") {
		t.Fatalf("hash %q is not a PHC argon2id string", h)
	}
	if ok, err := VerifyPassword(h, "correct horse"); !ok || err != nil {
		t.Fatalf("right password: %v, %v", ok, err)
	}
	if ok, _ := VerifyPassword(h, "correct horsf"); ok {
		t.Fatal("wrong password accepted")
	}
	h2, _ := HashPassword("correct horse", fastKDF)
	if h2 == h {
		t.Fatal("two hashes of one password are equal: salt not random")
	}
	for _, bad := range []string{"", "plain", "$argon2i$v=19$m=64,t=1,p=1$c2FsdA$aGFzaA", "$argon2id$v=19$m=99999999,t=1,p=1$c2FsdA$aGFzaA"} {
		if _, err := VerifyPassword(bad, "x"); err == nil {
			t.Errorf("VerifyPassword(%q) accepted a malformed hash", bad)
		}
	}
}

func TestParsePlain(t *testing.T) {
	z, u, p, err := ParsePlain([]byte("\x00alice\x00secret"))
	if err != nil || z != "" || u != "alice" || p != "secret" {
		t.Fatalf("ParsePlain = %q %q %q %v", z, u, p, err)
	}
	for _, bad := range []string{"", "alice", "\x00\x00pw", "a\x00b", "a\x00b\x00c\x00d", "\x00a\x00\xff"} {
		if _, _, _, err := ParsePlain([]byte(bad)); err == nil {
			t.Errorf("ParsePlain(%q) succeeded", bad)
		}
	}
}

type clock struct{ t time.Time }

func (c *clock) now() time.Time { return c.t }

func setup(t *testing.T) (*Directory, *Authenticator, *clock) {
	t.Helper()
	e, err := embedded.Open(t.TempDir(), embedded.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	d := &Directory{Store: e, KDF: fastKDF}
	c := &clock{t: time.Unix(1_800_000_000, 0)}
	a := NewAuthenticator(e, Options{DefaultDomain: "example.test", MaxFailures: 3, FailureWindow: time.Minute, Now: c.now})
	ctx := context.Background()
	if err := d.AddUser(ctx, "Alice@Example.test", "password1", 0); err != nil {
		t.Fatal(err)
	}
	if err := d.AddAlias(ctx, "ali@example.test", "alice@example.test"); err != nil {
		t.Fatal(err)
	}
	return d, a, c
}

var remote = netip.MustParseAddr("192.0.2.7")

func TestAuthenticate(t *testing.T) {
	d, a, _ := setup(t)
	ctx := context.Background()
	for _, login := range []string{"alice@example.test", "ALICE@example.test", "alice", "ali@example.test"} {
		if u, err := a.Authenticate(ctx, login, "password1", remote); err != nil || u != "alice@example.test" {
			t.Errorf("Authenticate(%s) = %q, %v", login, u, err)
		}
	}
	if _, err := a.Authenticate(ctx, "alice", "wrong-pass", remote); !errors.Is(err, ErrInvalidCredentials) {
		t.Fatalf("wrong password: %v", err)
	}
	if _, err := a.Authenticate(ctx, "nobody", "password1", netip.MustParseAddr("192.0.2.99")); !errors.Is(err, ErrInvalidCredentials) {
		t.Fatalf("unknown user: %v", err)
	}
	// A changed password invalidates the remembered login.
	if err := d.SetPassword(ctx, "alice@example.test", "password2"); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Authenticate(ctx, "alice", "password1", remote); !errors.Is(err, ErrInvalidCredentials) {
		t.Fatalf("old password after change: %v", err)
	}
	if _, err := a.Authenticate(ctx, "alice", "password2", remote); err != nil {
		t.Fatalf("new password: %v", err)
	}
	u, _ := d.Store.GetUser(ctx, "alice@example.test")
	u.Status = store.UserDisabled
	if err := d.Store.UpdateUser(ctx, u); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Authenticate(ctx, "alice", "password2", remote); !errors.Is(err, ErrDisabled) {
		t.Fatalf("disabled user: %v", err)
	}
	if err := d.AddUser(ctx, "short@example.test", "short", 0); !errors.Is(err, ErrWeakPassword) {
		t.Fatalf("short password: %v", err)
	}
	if err := d.AddUser(ctx, "not an address", "password1", 0); err == nil {
		t.Fatal("AddUser accepted a malformed address")
	}
}

func TestDefaultMailboxes(t *testing.T) {
	d, _, _ := setup(t)
	boxes, err := d.Store.(store.Engine).ListMailboxes(context.Background(), "alice@example.test")
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for _, m := range boxes {
		got[m.Name] = m.SpecialUse
	}
	for _, m := range DefaultMailboxes {
		if got[m.Name] != m.SpecialUse {
			t.Errorf("mailbox %s: special-use %q, want %q", m.Name, got[m.Name], m.SpecialUse)
		}
	}
	if _, ok := got["INBOX"]; !ok {
		t.Error("no INBOX")
	}
}

func TestThrottle(t *testing.T) {
	_, a, c := setup(t)
	ctx := context.Background()
	for i := 0; i < 3; i++ {
		if _, err := a.Authenticate(ctx, "alice", "wrong-pass", remote); !errors.Is(err, ErrInvalidCredentials) {
			t.Fatalf("failure %d: %v", i, err)
		}
	}
	// The user is now throttled, even with the right password and from elsewhere.
	if _, err := a.Authenticate(ctx, "alice", "password1", netip.MustParseAddr("198.51.100.1")); !errors.Is(err, ErrThrottled) {
		t.Fatalf("after 3 failures: %v", err)
	}
	// The IP is throttled for other users too.
	if _, err := a.Authenticate(ctx, "bob", "whatever1", remote); !errors.Is(err, ErrThrottled) {
		t.Fatalf("same IP, other user: %v", err)
	}
	c.t = c.t.Add(61 * time.Second)
	if _, err := a.Authenticate(ctx, "alice", "password1", remote); err != nil {
		t.Fatalf("after the window: %v", err)
	}
}

func TestLoopbackThrottledUnlessTrusted(t *testing.T) {
	d, a, _ := setup(t)
	ctx := context.Background()
	if err := d.AddUser(ctx, "bob@example.test", "password1", 0); err != nil {
		t.Fatal(err)
	}
	lo := netip.MustParseAddr("127.0.0.1")
	for i := range 3 {
		a.Authenticate(ctx, fmt.Sprintf("guess%d", i), "wrong-pass", lo)
	}
	if _, err := a.Authenticate(ctx, "bob", "password1", lo); !errors.Is(err, ErrThrottled) {
		t.Fatalf("loopback is not trusted by default, yet after 3 failures: %v", err)
	}

	e := d.Store.(UserStore)
	trusted := NewAuthenticator(e, Options{DefaultDomain: "example.test", MaxFailures: 3,
		TrustedNetworks: []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8"), netip.MustParsePrefix("2001:db8::/32")}})
	for _, peer := range []string{"127.0.0.1", "2001:db8::1"} {
		ip := netip.MustParseAddr(peer)
		for i := range 5 {
			trusted.Authenticate(ctx, fmt.Sprintf("guess%d", i), "wrong-pass", ip)
		}
		if _, err := trusted.Authenticate(ctx, "bob", "password1", ip); err != nil {
			t.Fatalf("trusted peer %s throttled for another user: %v", peer, err)
		}
	}
	// A trusted peer's attempts still count per account.
	for range 3 {
		trusted.Authenticate(ctx, "alice", "wrong-pass", lo)
	}
	if _, err := trusted.Authenticate(ctx, "alice", "password1", lo); !errors.Is(err, ErrThrottled) {
		t.Fatalf("account throttle skipped for a trusted peer: %v", err)
	}
}

// slowUser adds a user whose hash takes milliseconds to verify, so that
// concurrent attempts overlap.
func slowUser(t *testing.T, d *Directory, addr string) {
	t.Helper()
	slow := *d
	slow.KDF = KDFParams{MemoryKiB: 4 << 10, Time: 1, Threads: 1}
	if err := slow.AddUser(context.Background(), addr, "password1", 0); err != nil {
		t.Fatal(err)
	}
}

// Concurrent guesses are counted when they start: of 60 wrong passwords
// for one account sent at once from one address, no more than the limit
// are verified.
func TestConcurrentGuessesCounted(t *testing.T) {
	d, _, _ := setup(t)
	slowUser(t, d, "carol@example.test")
	a := NewAuthenticator(d.Store.(UserStore), Options{DefaultDomain: "example.test", MaxFailures: 10})
	const n = 60
	start := make(chan struct{})
	errs := make(chan error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			_, err := a.Authenticate(context.Background(), "carol", fmt.Sprintf("wrong-%d", i), remote)
			errs <- err
		}()
	}
	close(start)
	wg.Wait()
	close(errs)
	verified, throttled := 0, 0
	for err := range errs {
		switch {
		case errors.Is(err, ErrInvalidCredentials):
			verified++
		case errors.Is(err, ErrThrottled):
			throttled++
		default:
			t.Errorf("unexpected result %v", err)
		}
	}
	if verified > 10 || verified+throttled != n {
		t.Fatalf("%d of %d concurrent guesses verified (limit 10), %d throttled", verified, n, throttled)
	}
}

// A valid login from an address does not reset that address's failures:
// an attacker holding one account cannot interleave its own logins to
// guess at others without limit.
func TestSuccessKeepsPeerFailures(t *testing.T) {
	_, a, _ := setup(t)
	ctx := context.Background()
	verified := 0
	for i := range 20 {
		if _, err := a.Authenticate(ctx, fmt.Sprintf("victim%d", i), "guess", remote); errors.Is(err, ErrInvalidCredentials) {
			verified++
		}
		a.Authenticate(ctx, "alice", "password1", remote)
	}
	if verified > 3 {
		t.Fatalf("%d of 20 guesses interleaved with good logins verified (limit 3)", verified)
	}
	// A success clears the failures of its own account.
	other := netip.MustParseAddr("198.51.100.9")
	for range 2 {
		a.Authenticate(ctx, "alice", "wrong-pass", other)
	}
	if _, err := a.Authenticate(ctx, "alice", "password1", netip.MustParseAddr("198.51.100.10")); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if _, err := a.Authenticate(ctx, "alice", "wrong-pass", netip.MustParseAddr("198.51.100.11")); !errors.Is(err, ErrInvalidCredentials) {
			t.Fatalf("account failures not cleared by its success: %v", err)
		}
	}
}

// An alias and its account share one budget: the throttle counts the
// resolved account, not the typed login.
func TestAliasSharesAccountBudget(t *testing.T) {
	_, a, _ := setup(t)
	ctx := context.Background()
	for i, login := range []string{"ali@example.test", "ALI@example.test", "alice"} {
		peer := netip.AddrFrom4([4]byte{198, 51, 100, byte(i + 1)})
		if _, err := a.Authenticate(ctx, login, "wrong-pass", peer); !errors.Is(err, ErrInvalidCredentials) {
			t.Fatalf("failure %d: %v", i, err)
		}
	}
	if _, err := a.Authenticate(ctx, "alice@example.test", "password1", netip.MustParseAddr("198.51.100.50")); !errors.Is(err, ErrThrottled) {
		t.Fatalf("after 3 failures through alias and account: %v", err)
	}
}

// IPv6 peers are counted per /64, as connections are: rotating the
// interface identifier does not buy more guesses.
func TestIPv6ThrottledPerSlash64(t *testing.T) {
	_, a, _ := setup(t)
	ctx := context.Background()
	verified := 0
	for i := range 20 {
		peer := netip.AddrFrom16([16]byte{0x20, 0x01, 0x0d, 0xb8, 0, 1, 0, 2, 8: byte(i), 15: byte(i + 1)})
		if _, err := a.Authenticate(ctx, fmt.Sprintf("victim%d", i), "guess", peer); errors.Is(err, ErrInvalidCredentials) {
			verified++
		}
	}
	if verified > 3 {
		t.Fatalf("%d of 20 guesses from one /64 verified (limit 3)", verified)
	}
	// Another /64 has its own budget.
	if _, err := a.Authenticate(ctx, "alice", "password1", netip.MustParseAddr("2001:db8:1:3::1")); err != nil {
		t.Fatalf("neighbouring /64: %v", err)
	}
}

func TestDisabledNeedsPassword(t *testing.T) {
	d, a, _ := setup(t)
	ctx := context.Background()
	u, _ := d.Store.GetUser(ctx, "alice@example.test")
	u.Status = store.UserDisabled
	if err := d.Store.UpdateUser(ctx, u); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Authenticate(ctx, "alice", "wrong-pass", remote); !errors.Is(err, ErrInvalidCredentials) {
		t.Fatalf("disabled user, wrong password: %v (must not reveal the account)", err)
	}
}

func TestKDFPool(t *testing.T) {
	ctx := context.Background()
	// Budget for two 1 MiB evaluations.
	p := newKDFPool(2<<20, 8, 20*time.Millisecond)
	r1, err := p.acquire(ctx, 1024)
	if err != nil {
		t.Fatal(err)
	}
	r2, err := p.acquire(ctx, 1024)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.acquire(ctx, 1024); !errors.Is(err, ErrBusy) {
		t.Fatalf("third evaluation over the memory budget: %v, want ErrBusy", err)
	}
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := p.acquire(cctx, 1024); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled wait: %v", err)
	}
	// A waiter is admitted when room is released.
	p.wait = time.Minute
	got := make(chan error, 1)
	go func() {
		r, err := p.acquire(ctx, 1024)
		if err == nil {
			r()
		}
		got <- err
	}()
	for deadline := time.Now().Add(10 * time.Second); ; {
		p.mu.Lock()
		n := p.waiters.Len()
		p.mu.Unlock()
		if n == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the third evaluation never queued")
		}
		runtime.Gosched()
	}
	r1()
	if err := <-got; err != nil {
		t.Fatalf("waiter after a release: %v", err)
	}
	r2()
	// A hash larger than the whole budget still runs, alone.
	p.wait = time.Millisecond
	big, err := p.acquire(ctx, 8<<10)
	if err != nil {
		t.Fatalf("hash larger than the budget: %v", err)
	}
	if _, err := p.acquire(ctx, 1); !errors.Is(err, ErrBusy) {
		t.Fatalf("evaluation beside one holding the whole budget: %v", err)
	}
	p.wait = time.Millisecond
	big()
	if p.used != 0 || p.waiters.Len() != 0 {
		t.Fatalf("pool not empty at rest: used %d, %d waiters", p.used, p.waiters.Len())
	}
}

// The slots bound concurrency whatever the memory: with 2 slots, at most
// two checks run at once.
func TestKDFPoolSlots(t *testing.T) {
	p := newKDFPool(256<<20, 2, time.Minute)
	var mu sync.Mutex
	running, peak := 0, 0
	var wg sync.WaitGroup
	for range 20 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r, err := p.acquire(context.Background(), 64)
			if err != nil {
				t.Error(err)
				return
			}
			mu.Lock()
			running++
			peak = max(peak, running)
			mu.Unlock()
			if _, err := HashPassword("x", fastKDF); err != nil {
				t.Error(err)
			}
			mu.Lock()
			running--
			mu.Unlock()
			r()
		}()
	}
	wg.Wait()
	if peak > 2 {
		t.Fatalf("%d checks ran at once with 2 slots", peak)
	}
}

// Unknown and known users alike go through the pool (timing must not
// reveal which exist), and a refused check counts against nobody.
func TestAuthenticateBusy(t *testing.T) {
	d, _, _ := setup(t)
	reg := prometheus.NewRegistry()
	a := NewAuthenticator(d.Store.(UserStore), Options{DefaultDomain: "example.test", MaxFailures: 3,
		KDFConcurrency: 1, KDFMemoryBudget: 32 << 20, KDFWait: time.Millisecond, CacheTTL: -1, Registry: reg})
	ctx := context.Background()
	hold, err := a.kdf.acquire(ctx, 64)
	if err != nil {
		t.Fatal(err)
	}
	if got := gauge(t, reg, "quill_auth_kdf_memory_bytes"); got != 32<<20 {
		t.Fatalf("quill_auth_kdf_memory_bytes = %v with the pool's one slot held, want %d", got, 32<<20)
	}
	for range 5 {
		for _, login := range []string{"alice", "nobody"} {
			if _, err := a.Authenticate(ctx, login, "password1", remote); !errors.Is(err, ErrBusy) {
				t.Fatalf("%s with the pool full: %v, want ErrBusy", login, err)
			}
		}
	}
	hold()
	if u, err := a.Authenticate(ctx, "alice", "password1", remote); err != nil || u != "alice@example.test" {
		t.Fatalf("after the pool drained, busy attempts had been counted: %q, %v", u, err)
	}
}

// More logins at once from one address than the failure limit all succeed:
// attempts in progress make others wait rather than be refused, so a NAT
// or a proxy's concurrent logins are not mistaken for guessing.
func TestConcurrentLoginsFromOnePeer(t *testing.T) {
	d, _, _ := setup(t)
	slowUser(t, d, "carol@example.test")
	a := NewAuthenticator(d.Store.(UserStore), Options{DefaultDomain: "example.test", MaxFailures: 3, CacheTTL: -1})
	const n = 20
	start := make(chan struct{})
	errs := make(chan error, n)
	var wg sync.WaitGroup
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			_, err := a.Authenticate(context.Background(), "carol", "password1", remote)
			errs <- err
		}()
	}
	close(start)
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Errorf("concurrent good login from one peer: %v", err)
		}
	}
}

func gauge(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name {
			return mf.GetMetric()[0].GetGauge().GetValue()
		}
	}
	t.Fatalf("no metric %s", name)
	return 0
}

// After checks worth its whole budget, a pool going idle hands memory back
// once, and not again within the interval.
func TestKDFPoolReleasesWhenIdle(t *testing.T) {
	c := &clock{t: time.Unix(1_800_000_000, 0)}
	released := make(chan struct{}, 10)
	p := newKDFPool(4<<20, 2, time.Minute) // 2 slots of 2 MiB
	p.onIdle, p.now = func() { released <- struct{}{} }, c.now
	run := func(n int) {
		for range n {
			r, err := p.acquire(context.Background(), 1024)
			if err != nil {
				t.Fatal(err)
			}
			r()
		}
	}
	// releasedOnce waits for the release the pool decided on; notReleased
	// checks the pool decided on none (lastIdle records each decision).
	releasedOnce := func(what string) {
		t.Helper()
		select {
		case <-released:
		case <-time.After(10 * time.Second):
			t.Fatalf("no release %s", what)
		}
	}
	notReleased := func(what string, since time.Time) {
		t.Helper()
		p.mu.Lock()
		last := p.lastIdle
		p.mu.Unlock()
		if !last.Equal(since) || len(released) != 0 {
			t.Fatalf("released %s", what)
		}
	}
	run(1)
	notReleased("after half a budget of checks", time.Time{})
	run(1)
	releasedOnce("after a whole budget of checks")
	run(4)
	notReleased("again within the interval", c.t)
	c.t = c.t.Add(11 * time.Second)
	run(2)
	releasedOnce("after the interval")
}
