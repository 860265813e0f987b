// Package admin is Quill's administrative HTTP endpoint: /healthz, /readyz,
// Prometheus /metrics, and a small JSON API for users and aliases used by
// `quill user` and `quill alias` while a server runs. It also holds the
// client side of that API.
//
// The API (everything under /api/) and the Go profiler (/debug/pprof/)
// require the bearer token stored in the data directory; health, readiness
// and metrics do not. /api/cluster reports the node's cluster (quill cluster
// status) and /api/cluster/drain drains a node (quill cluster drain).
//
// Health and readiness answer different questions. /readyz is 503 whenever
// the node should not be sent traffic: while starting or draining, while
// it is overloaded (it refuses new connections then), and while its store
// cannot write (a full disk), with the reason. /healthz is
// 503 only when a restart is the remedy (the store failed for good); a full
// disk keeps it 200, saying why the node is degraded, because restarting
// would not free space and would drop the sessions still reading mail.
package admin

import (
	"context"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
	"net/http/pprof"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"quill/internal/auth"
	"quill/internal/mail"
	"quill/internal/store"
)

// Directory is the user administration the API exposes.
type Directory interface {
	AddUser(ctx context.Context, address, password string, quotaBytes int64) error
	SetPassword(ctx context.Context, address, password string) error
	SetQuota(ctx context.Context, address string, quotaBytes int64) error
	DeleteUser(ctx context.Context, address string) error
	ListUsers(ctx context.Context) ([]store.User, error)
	AddAlias(ctx context.Context, alias, target string) error
	DeleteAlias(ctx context.Context, alias string) error
	ListAliases(ctx context.Context) ([][2]string, error)
}

// Options configure the handler.
type Options struct {
	Directory Directory
	Gatherer  prometheus.Gatherer
	// Ready reports whether the node serves traffic (false while starting
	// and draining).
	Ready func() bool
	// Overloaded reports whether the node is overloaded (nil: never).
	Overloaded func() bool
	// Store reports the store's health (nil: always writable).
	Store func() store.Health
	// Cluster is the node's cluster (nil: the node runs alone).
	Cluster Cluster
	Token   string
	Logger  *slog.Logger
}

// UserInfo is a user as the API lists it (never with its password hash).
type UserInfo struct {
	Address    string `json:"address"`
	QuotaBytes int64  `json:"quota_bytes"`
	Disabled   bool   `json:"disabled"`
}

// UserRequest creates a user or changes its password or quota.
type UserRequest struct {
	Address    string `json:"address"`
	Password   string `json:"password,omitempty"`
	QuotaBytes *int64 `json:"quota_bytes,omitempty"`
}

// Alias is an alias and the user it delivers to.
type Alias struct {
	Alias  string `json:"alias"`
	Target string `json:"target"`
}

type apiError struct {
	Error string `json:"error"`
	Kind  string `json:"kind"` // not_found, exists, invalid, internal
}

// NewHandler returns the admin endpoint's handler.
func NewHandler(o Options) http.Handler {
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	mux := http.NewServeMux()
	health := func() store.Health {
		if o.Store == nil {
			return store.Health{Writable: true}
		}
		return o.Store()
	}
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		switch h := health(); {
		case h.Failed:
			http.Error(w, "unhealthy: store: "+h.Reason, http.StatusServiceUnavailable)
		case !h.Writable:
			w.Write([]byte("ok, degraded: store: " + h.Reason + "\n"))
		default:
			w.Write([]byte("ok\n"))
		}
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, r *http.Request) {
		if o.Ready != nil && !o.Ready() {
			http.Error(w, "not ready", http.StatusServiceUnavailable)
			return
		}
		if o.Overloaded != nil && o.Overloaded() {
			http.Error(w, "not ready: overloaded", http.StatusServiceUnavailable)
			return
		}
		if h := health(); !h.Writable {
			http.Error(w, "not ready: store: "+h.Reason, http.StatusServiceUnavailable)
			return
		}
		w.Write([]byte("ready\n"))
	})
	if o.Gatherer != nil {
		mux.Handle("GET /metrics", promhttp.HandlerFor(o.Gatherer, promhttp.HandlerOpts{}))
	}
	api := &api{d: o.Directory, c: o.Cluster, log: o.Logger}
	mux.HandleFunc("GET /api/users", api.listUsers)
	mux.HandleFunc("POST /api/users", api.addUser)
	mux.HandleFunc("PATCH /api/users/{address}", api.updateUser)
	mux.HandleFunc("DELETE /api/users/{address}", api.deleteUser)
	mux.HandleFunc("GET /api/aliases", api.listAliases)
	mux.HandleFunc("POST /api/aliases", api.addAlias)
	mux.HandleFunc("DELETE /api/aliases/{alias}", api.deleteAlias)
	mux.HandleFunc("GET /api/cluster", api.clusterStatus)
	mux.HandleFunc("POST /api/cluster/drain", api.clusterDrain)
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		protected := strings.HasPrefix(r.URL.Path, "/api/") || strings.HasPrefix(r.URL.Path, "/debug/")
		if protected && !authorized(r, o.Token) {
			writeJSON(w, http.StatusUnauthorized, apiError{Error: "missing or wrong bearer token", Kind: "unauthorized"})
			return
		}
		r.Body = http.MaxBytesReader(w, r.Body, 64<<10)
		mux.ServeHTTP(w, r)
	})
}

func authorized(r *http.Request, token string) bool {
	got, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	return ok && token != "" && subtle.ConstantTimeCompare([]byte(got), []byte(token)) == 1
}

type api struct {
	d   Directory
	c   Cluster // nil: the node runs alone
	log *slog.Logger
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(v)
}

// fail is the one place where errors become HTTP statuses.
func (a *api) fail(w http.ResponseWriter, err error) {
	switch {
	case errors.Is(err, store.ErrNotFound):
		writeJSON(w, http.StatusNotFound, apiError{err.Error(), "not_found"})
	case errors.Is(err, store.ErrExists):
		writeJSON(w, http.StatusConflict, apiError{err.Error(), "exists"})
	case errors.Is(err, store.ErrInvalid), errors.Is(err, mail.ErrBadAddress), errors.Is(err, auth.ErrWeakPassword), errors.Is(err, errBadRequest):
		writeJSON(w, http.StatusBadRequest, apiError{err.Error(), "invalid"})
	default:
		a.log.Error("admin API", "err", err)
		writeJSON(w, http.StatusInternalServerError, apiError{"internal error", "internal"})
	}
}

var errBadRequest = errors.New("malformed request")

func decode(r *http.Request, v any) error {
	if err := json.NewDecoder(r.Body).Decode(v); err != nil {
		return errors.Join(errBadRequest, err)
	}
	return nil
}

func (a *api) listUsers(w http.ResponseWriter, r *http.Request) {
	users, err := a.d.ListUsers(r.Context())
	if err != nil {
		a.fail(w, err)
		return
	}
	out := make([]UserInfo, len(users))
	for i, u := range users {
		out[i] = UserInfo{Address: u.Address, QuotaBytes: u.QuotaBytes, Disabled: u.Status == store.UserDisabled}
	}
	writeJSON(w, http.StatusOK, out)
}

func (a *api) addUser(w http.ResponseWriter, r *http.Request) {
	var req UserRequest
	if err := decode(r, &req); err != nil {
		a.fail(w, err)
		return
	}
	var quota int64
	if req.QuotaBytes != nil {
		quota = *req.QuotaBytes
	}
	if err := a.d.AddUser(r.Context(), req.Address, req.Password, quota); err != nil {
		a.fail(w, err)
		return
	}
	w.WriteHeader(http.StatusCreated)
}

func (a *api) updateUser(w http.ResponseWriter, r *http.Request) {
	var req UserRequest
	if err := decode(r, &req); err != nil {
		a.fail(w, err)
		return
	}
	addr := r.PathValue("address")
	if req.Password != "" {
		if err := a.d.SetPassword(r.Context(), addr, req.Password); err != nil {
			a.fail(w, err)
			return
		}
	}
	if req.QuotaBytes != nil {
		if err := a.d.SetQuota(r.Context(), addr, *req.QuotaBytes); err != nil {
			a.fail(w, err)
			return
		}
	}
	w.WriteHeader(http.StatusNoContent)
}

func (a *api) deleteUser(w http.ResponseWriter, r *http.Request) {
	if err := a.d.DeleteUser(r.Context(), r.PathValue("address")); err != nil {
		a.fail(w, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (a *api) listAliases(w http.ResponseWriter, r *http.Request) {
	list, err := a.d.ListAliases(r.Context())
	if err != nil {
		a.fail(w, err)
		return
	}
	out := make([]Alias, len(list))
	for i, p := range list {
		out[i] = Alias{Alias: p[0], Target: p[1]}
	}
	writeJSON(w, http.StatusOK, out)
}

func (a *api) addAlias(w http.ResponseWriter, r *http.Request) {
	var req Alias
	if err := decode(r, &req); err != nil {
		a.fail(w, err)
		return
	}
	if err := a.d.AddAlias(r.Context(), req.Alias, req.Target); err != nil {
		a.fail(w, err)
		return
	}
	w.WriteHeader(http.StatusCreated)
}

func (a *api) deleteAlias(w http.ResponseWriter, r *http.Request) {
	if err := a.d.DeleteAlias(r.Context(), r.PathValue("alias")); err != nil {
		a.fail(w, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}
