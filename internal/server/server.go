// Package server is Quill's composition root: it builds every component
// from the configuration, starts them in dependency order (store, services,
// listeners, then readiness) and stops them in reverse (readiness off,
// listeners drained, admin endpoint, store closed last so that every
// in-flight delivery commits).
package server

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"runtime/debug"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"quill/internal/admin"
	"quill/internal/auth"
	"quill/internal/cluster"
	"quill/internal/cluster/events"
	"quill/internal/cluster/forward"
	"quill/internal/cluster/pending"
	"quill/internal/config"
	"quill/internal/delivery"
	"quill/internal/load"
	"quill/internal/mailbox"
	"quill/internal/pop3"
	"quill/internal/smtp"
	"quill/internal/store"
	"quill/internal/textconn"
	"quill/internal/usermgr"
)

// Run-time files in the data directory.
const (
	StoreDir       = "store"
	TLSDir         = "tls"
	AdminTokenFile = "admin.token" // bearer token of the admin API (0600)
	AdminAddrFile  = "admin.addr"  // where a running server's admin API listens
)

// bodyBudgetWait is how long a body waits for room in the body memory
// budget before its client gets a temporary error: long enough for a
// large body in flight to be stored, short enough that the client, whose
// TCP window is closed meanwhile, does not give up first.
const bodyBudgetWait = 30 * time.Second

// protocolServer is what every protocol front end offers.
type protocolServer interface {
	Serve(net.Listener) error
	Shutdown(context.Context) error
	Close() error
}

// nodeStore is the store the services use: usermgr.Manager, or
// forward.Store over it.
type nodeStore interface {
	store.Store
	Move(ctx context.Context, from store.ID, uids []uint32, to store.ID) (src, dst []uint32, err error)
	SetMeta(ctx context.Context, mailbox store.ID, metas map[uint32][]byte) error
}

// Server is one running Quill node.
type Server struct {
	cfg config.Config
	log *slog.Logger

	// store is what every service uses: the user manager over engine, or
	// with the cluster on, the forwarder that sends each write to the
	// user's manager (this node's user manager or another node's).
	store   nodeStore
	engine  store.Engine
	cluster *cluster.Node // nil with the cluster off
	// pending applies the pending deliveries of the buckets this node
	// manages (nil with the cluster off).
	pending *pending.Applier
	load    *load.Monitor
	reg     *prometheus.Registry
	ready   atomic.Bool

	listeners map[string]net.Listener
	servers   map[string]protocolServer
	admin     *http.Server
	serveErr  chan error
	wg        sync.WaitGroup
}

// New validates cfg and returns an unstarted server.
func New(cfg config.Config, log *slog.Logger) (*Server, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return &Server{
		cfg: cfg, log: log,
		listeners: map[string]net.Listener{},
		servers:   map[string]protocolServer{},
		serveErr:  make(chan error, 16),
	}, nil
}

// Start opens the store, builds the services, binds every listener and
// starts serving. If any step fails, everything started is stopped again.
func (s *Server) Start() (err error) {
	defer func() {
		if err != nil {
			s.closeAll()
		}
	}()
	cfg := s.cfg
	if err := os.MkdirAll(cfg.DataDir, 0o700); err != nil {
		return err
	}
	s.reg = prometheus.NewRegistry()
	s.reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))

	if s.engine, err = s.openStore(); err != nil {
		return err
	}
	// One connection limiter for every listener; its count of sessions is
	// also the node's load in the cluster. It refuses new connections
	// while the load monitor finds the node overloaded.
	limiter := textconn.NewLimiter(cfg.Limits.MaxConnectionsPerIP, cfg.Limits.MaxConnections)
	threshold := cfg.Limits.OverloadLatency.Duration
	if threshold == 0 {
		threshold = -1 // off: measured, never shed
	}
	if s.load, err = load.Start(load.Options{Threshold: threshold, Sessions: limiter.Active,
		Logger: s.log.With("component", "load"), Registerer: s.reg}); err != nil {
		return err
	}
	limiter.ShedWhen(s.load)
	// The change hub wakes IMAP sessions (IDLE) when a mailbox changes; the
	// user manager, this node's one writer of every user's mailboxes,
	// announces each durable write there, and with the cluster on also to
	// the other nodes whose sessions watch the mailbox (the hub tells the
	// fan-out which mailboxes this node's sessions watch); their events
	// reach the hub too.
	hub := mailbox.NewHub()
	var notifier usermgr.Notifier = hub
	// A Cassandra keyspace's engine mode must fit the node: the batch mode
	// with the cluster on (claimed once the cluster runs, if the keyspace
	// has no mode yet), the ordered mode without it (ADR 0031).
	modeCtx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	engine, claimMode, err := fitStoreMode(modeCtx, s.engine, cfg.Store.Cassandra.Keyspace, config.Enabled(cfg.Cluster.Addr))
	if err != nil {
		return err
	}
	s.engine = engine
	if config.Enabled(cfg.Cluster.Addr) {
		if err := s.startCluster(hub); err != nil {
			return err
		}
		if err := claimMode(modeCtx); err != nil {
			return err
		}
		notifier = s.cluster.Events()
		hub.Observe(s.cluster.Events())
	}
	if err := s.startStore(hub, notifier); err != nil {
		return err
	}
	tlsConfig, err := loadTLS(cfg.TLS.CertFile, cfg.TLS.KeyFile, filepath.Join(cfg.DataDir, TLSDir), cfg.Hostname)
	if err != nil {
		return err
	}
	trusted, _ := config.ParsePrefixes(cfg.Auth.TrustedNetworks) // validated in New
	authn := auth.NewAuthenticator(s.store, auth.Options{
		DefaultDomain:   cfg.Domains[0],
		MaxFailures:     cfg.Auth.MaxFailures,
		FailureWindow:   cfg.Auth.FailureWindow.Duration,
		TrustedNetworks: trusted,
		KDFMemoryBudget: cfg.Auth.KDFMemoryBudget,
		KDFConcurrency:  cfg.Auth.KDFConcurrency,
		KDFWait:         cfg.Auth.KDFWait.Duration,
		ReleaseMemory:   debug.FreeOSMemory,
		CacheTTL:        cfg.Auth.CacheTTL.Duration,
		Logger:          s.log.With("component", "auth"),
		Registry:        s.reg,
	})
	// With no IMAP listener nothing reads a message's summary until one is
	// enabled, and IMAP then computes and keeps the summaries of the
	// messages delivered meanwhile (docs/adr/0011); with one, delivery
	// computes them (ADR 0007).
	_, lazy := s.engine.(store.MetaSetter)
	lazy = lazy && !config.Enabled(cfg.Listeners.IMAP) && !config.Enabled(cfg.Listeners.IMAPS)
	// One budget for every body in flight, SMTP, LMTP and IMAP APPEND.
	budget := delivery.NewBudget(cfg.Limits.BodyMemoryBudget, bodyBudgetWait)
	agent := delivery.NewAgent(s.store, delivery.Options{
		Budget:              budget,
		LazySummaries:       lazy,
		Domains:             cfg.Domains,
		Hostname:            cfg.Hostname,
		SubaddressSeparator: cfg.Delivery.SubaddressSeparator,
		DirectoryTTL:        directoryTTL(cfg),
		MaxMessageBytes:     cfg.Limits.MaxMessageBytes + 64<<10, // room for the trace fields
		Logger:              s.log.With("component", "delivery"),
		Registerer:          s.reg,
	})
	for _, d := range cfg.Domains {
		if _, err := s.store.Resolve(context.Background(), "postmaster@"+d); err != nil {
			s.log.Warn("no postmaster: RFC 5321 4.5.1 requires one; add a user or an alias", "address", "postmaster@"+d)
		}
	}

	newSMTP := func(name string, mode smtp.Mode, implicit bool) *smtp.Server {
		return &smtp.Server{
			Mode: mode, Hostname: cfg.Hostname, TLSConfig: tlsConfig, ImplicitTLS: implicit,
			AllowInsecureAuth: cfg.Auth.AllowInsecure,
			Backend:           smtpBackend{authn, agent},
			Logger:            s.log.With("listener", name),
			Metrics:           textconn.NewMetrics(s.reg, name),
			Limiter:           limiter,
			MaxMessageBytes:   cfg.Limits.MaxMessageBytes,
			MaxRecipients:     cfg.Limits.MaxRecipients,
			MaxErrors:         cfg.Limits.MaxErrors,
			ReadTimeout:       cfg.Limits.CommandTimeout.Duration,
			PreauthTimeout:    cfg.Limits.PreauthTimeout.Duration,
			HandshakeTimeout:  cfg.Limits.TLSHandshakeTimeout.Duration,
			MinTransferRate:   cfg.Limits.MinTransferRate,
			TransferGrace:     cfg.Limits.TransferGrace.Duration,
		}
	}
	// One maildrop service for every POP3 listener: its lock is per user.
	mailboxes := mailbox.NewService(s.store)
	newPOP3 := func(name string, implicit bool) *pop3.Server {
		return &pop3.Server{
			Name: name, Hostname: cfg.Hostname, TLSConfig: tlsConfig, ImplicitTLS: implicit,
			AllowInsecureAuth: cfg.Auth.AllowInsecure,
			Backend:           pop3Backend{authn, mailboxes},
			Logger:            s.log, // the POP3 server labels its log with Name
			Metrics:           textconn.NewMetrics(s.reg, name),
			Limiter:           limiter,
			MaxErrors:         cfg.Limits.MaxErrors,
			ReadTimeout:       cfg.Limits.POP3IdleTimeout.Duration,
			UnauthTimeout:     cfg.Limits.PreauthTimeout.Duration,
			HandshakeTimeout:  cfg.Limits.TLSHandshakeTimeout.Duration,
		}
	}
	imapSrv := imapServers{cfg: cfg, log: s.log, reg: s.reg, tls: tlsConfig, limiter: limiter,
		backend: imapBackend{authn, mailbox.NewMailboxes(s.store, hub), budget}}
	l := cfg.Listeners
	for _, x := range []struct {
		name, network, addr string
		srv                 func() protocolServer
	}{
		{"smtp", "tcp", l.SMTP, func() protocolServer { return newSMTP("smtp", smtp.ModeMX, false) }},
		{"submission", "tcp", l.Submission, func() protocolServer { return newSMTP("submission", smtp.ModeSubmission, false) }},
		{"submissions", "tcp", l.Submissions, func() protocolServer { return newSMTP("submissions", smtp.ModeSubmission, true) }},
		{"lmtp", "tcp", l.LMTP, func() protocolServer { return newSMTP("lmtp", smtp.ModeLMTP, false) }},
		{"lmtp_socket", "unix", l.LMTPSocket, func() protocolServer { return newSMTP("lmtp_socket", smtp.ModeLMTP, false) }},
		{"pop3", "tcp", l.POP3, func() protocolServer { return newPOP3("pop3", false) }},
		{"pop3s", "tcp", l.POP3S, func() protocolServer { return newPOP3("pop3s", true) }},
		{"imap", "tcp", l.IMAP, func() protocolServer { return imapSrv.new("imap", false) }},
		{"imaps", "tcp", l.IMAPS, func() protocolServer { return imapSrv.new("imaps", true) }},
	} {
		if !config.Enabled(x.addr) {
			continue
		}
		// TCP keep-alive probes (see listen) only for IMAP, whose IDLE
		// sessions stay silent for many minutes.
		ln, err := listen(x.network, x.addr, x.name == "imap" || x.name == "imaps")
		if err != nil {
			return fmt.Errorf("listener %s: %w", x.name, err)
		}
		if slices.Contains(cfg.ProxyProtocol.Listeners, x.name) {
			proxies, _ := config.ParsePrefixes(cfg.ProxyProtocol.TrustedProxies) // validated in New
			ln = textconn.NewProxyListener(ln, proxies, cfg.ProxyProtocol.HeaderTimeout.Duration, s.log.With("listener", x.name))
		}
		s.listeners[x.name] = ln
		s.servers[x.name] = x.srv()
	}
	if config.Enabled(l.Admin) {
		if err := s.startAdmin(authn); err != nil {
			return err
		}
	}
	for name, srv := range s.servers {
		ln := s.listeners[name]
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			if err := srv.Serve(ln); err != nil && !isClosed(err) {
				s.serveErr <- fmt.Errorf("listener %s: %w", name, err)
			}
		}()
	}
	s.ready.Store(true)
	s.log.Info("quill ready", "listeners", s.Listeners(), "data", cfg.DataDir, "domains", cfg.Domains)
	return nil
}

// startCluster starts this node's part of the cluster (credentials from
// the store, transport, membership: internal/cluster), before any listener
// serves, so that a ready node has joined.
func (s *Server) startCluster(local events.Local) error {
	secrets, ok := s.engine.(store.Secrets)
	if !ok {
		return fmt.Errorf("cluster: store engine %T keeps no secrets", s.engine)
	}
	own, ok := s.engine.(store.Ownership)
	if !ok {
		return fmt.Errorf("cluster: store engine %T keeps no cluster map", s.engine)
	}
	c := s.cfg.Cluster
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	node, err := cluster.Start(ctx, cluster.Options{
		DataDir: s.cfg.DataDir, Addr: c.Addr, Advertise: c.AdvertiseAddr, Join: c.Join,
		DetectionTimeout: c.DetectionTimeout.Duration, Secrets: secrets, Ownership: own, LeaseTerm: c.LeaseTerm.Duration,
		Load: s.load, Local: local,
		Logger: s.log.With("component", "cluster"), Registerer: s.reg,
	})
	if err != nil {
		return fmt.Errorf("cluster: %w", err)
	}
	s.cluster = node
	return nil
}

// startStore builds the user manager, telling notifier of its writes
// (the hub, or with the cluster on the node's fan-out of events) and,
// with the cluster on, the forwarder in front of it and the handler of the
// writes other nodes forward here (internal/cluster/forward): this node's
// manager then writes only the users whose buckets it manages
// (cluster.Node.Owner). After a forwarded write the forwarder tells the
// local hub at once; the manager's node tells every node that watches the
// mailbox, this one too.
//
// With the cluster on, on Cassandra, the engine is the batch mode
// (fitStoreMode): the manager writes each user's mailboxes as batches
// stamped with the ownership epoch of the user's bucket (Options.Owner,
// Batch.Epoch) and adopts each mailbox under that epoch before its first
// batch (store.Adopter), which fences every write of an earlier owner.
// Without the cluster it is the ordered engine, and the manager passes
// the writes through.
func (s *Server) startStore(hub *mailbox.Hub, notifier usermgr.Notifier) error {
	opts := usermgr.Options{Notifier: notifier}
	if s.cluster == nil {
		s.store = usermgr.New(s.engine, opts)
		return nil
	}
	owner := s.cluster.Owner()
	opts.Owner = owner
	mgr := usermgr.New(s.engine, opts)
	s.store = mgr
	h, err := forward.NewHandler(mgr, owner, s.reg)
	if err != nil {
		return err
	}
	s.cluster.ServeForwarded(h)
	fopts := forward.Options{
		Local: mgr, Owner: owner, Peers: s.cluster, Timeout: s.cfg.Cluster.ForwardTimeout.Duration,
		Notifier: hub, Logger: s.log.With("component", "forward"), Registerer: s.reg,
	}
	// Deliveries that cannot reach the manager are recorded and applied
	// later (ADR 0034) on an engine several nodes share.
	if pd, ok := s.engine.(store.PendingDeliveries); ok {
		fopts.Pending = pd
		s.pending, err = pending.Start(pending.Options{Store: pd, Manager: mgr, Owner: owner,
			Logger: s.log.With("component", "pending"), Registerer: s.reg})
		if err != nil {
			return err
		}
	}
	fs, err := forward.New(fopts)
	if err != nil {
		return err
	}
	s.store = fs
	return nil
}

func (s *Server) startAdmin(authn *auth.Authenticator) error {
	token, err := adminToken(filepath.Join(s.cfg.DataDir, AdminTokenFile))
	if err != nil {
		return err
	}
	ln, err := listen("tcp", s.cfg.Listeners.Admin, true)
	if err != nil {
		return fmt.Errorf("listener admin: %w", err)
	}
	s.listeners["admin"] = ln
	s.admin = &http.Server{
		Handler: admin.NewHandler(admin.Options{
			Directory:  &auth.Directory{Store: s.store},
			Gatherer:   s.reg,
			Ready:      s.ready.Load,
			Overloaded: s.load.Overloaded,
			Store:      storeHealth(s.engine),
			Cluster:    clusterAdmin(s.cluster),
			Token:      token,
			Logger:     s.log.With("component", "admin"),
		}),
		ReadHeaderTimeout: 10 * time.Second,
		ReadTimeout:       time.Minute,
		WriteTimeout:      time.Minute,
		ErrorLog:          slog.NewLogLogger(s.log.Handler(), slog.LevelWarn),
	}
	if err := writeFileAtomic(filepath.Join(s.cfg.DataDir, AdminAddrFile), []byte(ln.Addr().String()+"\n"), 0o600); err != nil {
		return err
	}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		if err := s.admin.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			s.serveErr <- fmt.Errorf("listener admin: %w", err)
		}
	}()
	return nil
}

// adminToken reads the admin API token, creating it on first start.
func adminToken(path string) (string, error) {
	if b, err := os.ReadFile(path); err == nil {
		if t := strings.TrimSpace(string(b)); t != "" {
			return t, nil
		}
	} else if !errors.Is(err, os.ErrNotExist) {
		return "", err
	}
	raw := make([]byte, 32)
	if _, err := rand.Read(raw); err != nil {
		return "", err
	}
	t := hex.EncodeToString(raw)
	return t, writeFileAtomic(path, []byte(t+"\n"), 0o600)
}

// listen opens a listener. Without keepAlive, TCP connections it accepts
// get no keep-alive probes: the SMTP, LMTP and POP3 sessions end on their
// own read timeouts (minutes), well before probes (15 s idle, then 9 more
// 15 s apart) would find a dead peer, and turning them on costs four
// setsockopt calls per connection, a measurable share of a session that
// carries one message (docs/performance.md).
func listen(network, addr string, keepAlive bool) (net.Listener, error) {
	if network == "unix" {
		// A socket file left by a crashed server would make Listen fail.
		if fi, err := os.Lstat(addr); err == nil && fi.Mode()&os.ModeSocket != 0 {
			os.Remove(addr)
		}
	}
	var lc net.ListenConfig
	if !keepAlive {
		lc.KeepAlive = -1
	}
	return lc.Listen(context.Background(), network, addr)
}

func isClosed(err error) bool {
	return errors.Is(err, net.ErrClosed) || errors.Is(err, http.ErrServerClosed) || strings.Contains(err.Error(), "server closed")
}

// Listeners returns the bound address of every enabled listener.
func (s *Server) Listeners() map[string]string {
	out := make(map[string]string, len(s.listeners))
	for name, ln := range s.listeners {
		out[name] = ln.Addr().String()
	}
	if s.cluster != nil {
		out["cluster"] = s.cluster.Addr()
	}
	return out
}

// Errors delivers a listener's fatal serving error; the caller should then
// shut down.
func (s *Server) Errors() <-chan error { return s.serveErr }

// Shutdown drains the node: readiness goes off, listeners stop accepting and
// sessions finish (idle ones are told to come back later) until ctx ends,
// then everything is closed and the store last.
func (s *Server) Shutdown(ctx context.Context) error {
	s.ready.Store(false)
	s.log.Info("quill draining")
	names := make([]string, 0, len(s.servers))
	for name := range s.servers {
		names = append(names, name)
	}
	sort.Strings(names)
	var wg sync.WaitGroup
	errs := make([]error, len(names))
	for i, name := range names {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := s.servers[name].Shutdown(ctx); err != nil {
				errs[i] = fmt.Errorf("%s: %w", name, err)
				s.servers[name].Close()
			}
		}()
	}
	wg.Wait()
	if s.admin != nil {
		os.Remove(filepath.Join(s.cfg.DataDir, AdminAddrFile))
		if err := s.admin.Shutdown(ctx); err != nil {
			s.admin.Close()
		}
	}
	s.wg.Wait()
	err := errors.Join(errs...)
	if s.pending != nil {
		s.pending.Close()
	}
	if s.cluster != nil {
		// Leaves the cluster (the others list this node dead at once),
		// then stops membership and the transport.
		err = errors.Join(err, s.cluster.Shutdown(ctx))
	}
	if s.store != nil {
		err = errors.Join(err, s.store.Close())
	}
	s.load.Stop()
	s.log.Info("quill stopped", "err", err)
	return err
}

// closeAll stops whatever a failed Start had begun.
func (s *Server) closeAll() {
	for _, srv := range s.servers {
		srv.Close()
	}
	for _, ln := range s.listeners {
		ln.Close()
	}
	if s.admin != nil {
		s.admin.Close()
		os.Remove(filepath.Join(s.cfg.DataDir, AdminAddrFile))
	}
	s.wg.Wait()
	if s.pending != nil {
		s.pending.Close()
	}
	if s.cluster != nil {
		s.cluster.Shutdown(context.Background())
	}
	if s.store != nil {
		s.store.Close()
	} else if s.engine != nil {
		s.engine.Close() // a start that failed before the store was built
	}
	s.load.Stop()
}

// openStore opens the configured engine (see OpenStore).
func (s *Server) openStore() (store.Engine, error) {
	return OpenStore(s.cfg, s.log.With("component", "store"), s.reg)
}
