package auth

import (
	"context"
	"errors"
	"net/netip"
	"strings"
	"testing"
	"time"

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
	boxes, err := d.Store.(store.Store).ListMailboxes(context.Background(), "alice@example.test")
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

func TestLoopbackNotThrottledByIP(t *testing.T) {
	d, a, _ := setup(t)
	ctx := context.Background()
	if err := d.AddUser(ctx, "bob@example.test", "password1", 0); err != nil {
		t.Fatal(err)
	}
	lo := netip.MustParseAddr("127.0.0.1")
	for i := 0; i < 5; i++ {
		a.Authenticate(ctx, "alice", "wrong-pass", lo)
	}
	if _, err := a.Authenticate(ctx, "bob", "password1", lo); err != nil {
		t.Fatalf("loopback peer throttled for another user: %v", err)
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
