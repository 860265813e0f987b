package admin

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"quill/internal/auth"
	"quill/internal/store"
	"quill/internal/store/embedded"
)

func setup(t *testing.T, ready *bool) (*httptest.Server, *Client) {
	t.Helper()
	e, err := embedded.Open(t.TempDir(), embedded.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	reg := prometheus.NewRegistry()
	reg.MustRegister(prometheus.NewCounter(prometheus.CounterOpts{Name: "quill_test_total", Help: "test"}))
	h := NewHandler(Options{
		Directory: &auth.Directory{Store: e, KDF: auth.KDFParams{MemoryKiB: 64, Time: 1, Threads: 1}},
		Gatherer:  reg,
		Ready:     func() bool { return *ready },
		Token:     "s3cret",
	})
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return srv, &Client{Addr: strings.TrimPrefix(srv.URL, "http://"), Token: "s3cret"}
}

func get(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func TestHealthReadyMetrics(t *testing.T) {
	ready := false
	srv, _ := setup(t, &ready)
	if code, _ := get(t, srv.URL+"/healthz"); code != 200 {
		t.Fatalf("healthz = %d", code)
	}
	if code, _ := get(t, srv.URL+"/readyz"); code != 503 {
		t.Fatalf("readyz while not ready = %d", code)
	}
	ready = true
	if code, _ := get(t, srv.URL+"/readyz"); code != 200 {
		t.Fatalf("readyz when ready = %d", code)
	}
	if code, body := get(t, srv.URL+"/metrics"); code != 200 || !strings.Contains(body, "quill_test_total") {
		t.Fatalf("metrics = %d %q", code, body)
	}
}

func TestAPIRequiresToken(t *testing.T) {
	ready := true
	srv, c := setup(t, &ready)
	for _, path := range []string{"/api/users", "/debug/pprof/", "/debug/pprof/heap"} {
		if code, _ := get(t, srv.URL+path); code != http.StatusUnauthorized {
			t.Fatalf("%s without token: %d", path, code)
		}
	}
	req, _ := http.NewRequest("GET", srv.URL+"/debug/pprof/heap", nil)
	req.Header.Set("Authorization", "Bearer s3cret")
	resp, err := http.DefaultClient.Do(req)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("heap profile with token: %v %v", resp, err)
	}
	resp.Body.Close()
	bad := *c
	bad.Token = "guess"
	if _, err := bad.ListUsers(context.Background()); err == nil {
		t.Fatal("wrong token accepted")
	}
}

func TestUserAndAliasAPI(t *testing.T) {
	ready := true
	_, c := setup(t, &ready)
	ctx := context.Background()
	if err := c.AddUser(ctx, "Alice@Example.test", "password1", 1000); err != nil {
		t.Fatal(err)
	}
	if err := c.AddUser(ctx, "alice@example.test", "password1", 0); !errors.Is(err, store.ErrExists) {
		t.Fatalf("duplicate: %v", err)
	}
	if err := c.AddUser(ctx, "bob@example.test", "short", 0); !errors.Is(err, store.ErrInvalid) {
		t.Fatalf("weak password: %v", err)
	}
	if err := c.SetPassword(ctx, "alice@example.test", "password2"); err != nil {
		t.Fatal(err)
	}
	if err := c.SetQuota(ctx, "alice@example.test", 5000); err != nil {
		t.Fatal(err)
	}
	users, err := c.ListUsers(ctx)
	if err != nil || len(users) != 1 || users[0].Address != "alice@example.test" || users[0].QuotaBytes != 5000 {
		t.Fatalf("ListUsers = %+v, %v", users, err)
	}
	if err := c.AddAlias(ctx, "ali@example.test", "alice@example.test"); err != nil {
		t.Fatal(err)
	}
	aliases, err := c.ListAliases(ctx)
	if err != nil || len(aliases) != 1 || aliases[0] != [2]string{"ali@example.test", "alice@example.test"} {
		t.Fatalf("ListAliases = %v, %v", aliases, err)
	}
	if err := c.DeleteAlias(ctx, "ali@example.test"); err != nil {
		t.Fatal(err)
	}
	if err := c.DeleteUser(ctx, "alice@example.test"); err != nil {
		t.Fatal(err)
	}
	if err := c.DeleteUser(ctx, "alice@example.test"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("delete twice: %v", err)
	}
}

// TestHealthReportsStore: a store that cannot write makes /readyz 503 with
// the reason; /healthz stays 200 (degraded) for a full disk, which a
// restart would not cure, and is 503 only for a failed store. The real
// engine's states are exercised end to end by e2e TestDiskFull.
func TestHealthReportsStore(t *testing.T) {
	for _, tc := range []struct {
		name                  string
		h                     store.Health
		health, ready         int
		healthBody, readyBody string
	}{
		{"writable", store.Health{Writable: true}, 200, 200, "ok\n", "ready\n"},
		{"full", store.Health{Reason: "disk full since X"}, 200, 503, "ok, degraded: store: disk full since X\n", "not ready: store: disk full since X\n"},
		{"failed", store.Health{Failed: true, Reason: "body log failed"}, 503, 503, "unhealthy: store: body log failed\n", "not ready: store: body log failed\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := httptest.NewServer(NewHandler(Options{
				Ready: func() bool { return true },
				Store: func() store.Health { return tc.h },
			}))
			defer srv.Close()
			if code, body := get(t, srv.URL+"/healthz"); code != tc.health || body != tc.healthBody {
				t.Errorf("/healthz = %d %q, want %d %q", code, body, tc.health, tc.healthBody)
			}
			if code, body := get(t, srv.URL+"/readyz"); code != tc.ready || body != tc.readyBody {
				t.Errorf("/readyz = %d %q, want %d %q", code, body, tc.ready, tc.readyBody)
			}
		})
	}
}

// TestClusterOff: on a node without a cluster, the cluster endpoints say
// so (and still require the token).
func TestClusterOff(t *testing.T) {
	ready := true
	srv, c := setup(t, &ready)
	if code, _ := get(t, srv.URL+"/api/cluster"); code != http.StatusUnauthorized {
		t.Fatalf("/api/cluster without token = %d", code)
	}
	if _, err := c.ClusterStatus(context.Background()); !errors.Is(err, ErrClusterOff) {
		t.Fatalf("ClusterStatus = %v, want ErrClusterOff", err)
	}
	if _, err := c.Drain(context.Background(), "x", true); !errors.Is(err, ErrClusterOff) {
		t.Fatalf("Drain = %v, want ErrClusterOff", err)
	}
}
