package server

import (
	"context"
	"log/slog"
	"path/filepath"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"quill/internal/config"
	"quill/internal/store"
	"quill/internal/store/cassandra"
	"quill/internal/store/embedded"
)

// storeHealth returns the health function of an engine that reports it
// (the embedded one), for the admin endpoint's /healthz and /readyz.
func storeHealth(st store.Engine) func() store.Health {
	if h, ok := st.(store.HealthReporter); ok {
		return h.Health
	}
	return nil
}

// OpenStore opens the engine cfg.Store.Engine names, as quill serve does;
// the admin commands call it too, so that both always agree on the engine
// and its options. The embedded engine lives in cfg.DataDir/StoreDir and
// admits one process at a time; the Cassandra engine may be opened by any
// number of processes at once (it creates the keyspace and applies the
// schema migrations when needed). reg may be nil. It returns a nil
// interface (never a typed nil) on error.
func OpenStore(cfg config.Config, log *slog.Logger, reg prometheus.Registerer) (store.Engine, error) {
	if cfg.Store.Engine != "cassandra" {
		reserve := cfg.Store.ReserveBytes
		if reserve == 0 {
			reserve = -1 // embedded.Options: none
		}
		e, err := embedded.Open(filepath.Join(cfg.DataDir, StoreDir), embedded.Options{
			Logger: log, Registerer: reg, CacheBytes: cfg.Store.CacheBytes, ReserveBytes: reserve,
		})
		if err != nil {
			return nil, err
		}
		return e, nil
	}
	c := cfg.Store.Cassandra
	opts := cassandra.Options{
		Hosts: c.Hosts, Keyspace: c.Keyspace, Username: c.Username, Password: c.Password,
		ConnectTimeout: c.ConnectTimeout.Duration, Timeout: c.Timeout.Duration, Logger: log,
		MaildropLease: c.MaildropLease.Duration,
		Replication:   map[string]string{"class": c.ReplicationClass},
	}
	if c.ReplicationClass == "SimpleStrategy" {
		opts.Replication["replication_factor"] = strconv.Itoa(c.ReplicationFactor)
	}
	for dc, f := range c.Datacenters {
		opts.Replication[dc] = strconv.Itoa(f)
	}
	var err error
	if opts.ReadConsistency, err = cassandra.ParseConsistency(c.ReadConsistency); err != nil {
		return nil, err
	}
	if opts.WriteConsistency, err = cassandra.ParseConsistency(c.WriteConsistency); err != nil {
		return nil, err
	}
	if opts.SerialConsistency, err = cassandra.ParseConsistency(c.SerialConsistency); err != nil {
		return nil, err
	}
	if c.TLS {
		if opts.TLS, err = cassandra.TLSConfig(c.CAFile, c.CertFile, c.KeyFile, c.ServerName); err != nil {
			return nil, err
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	e, err := cassandra.Open(ctx, opts)
	if err != nil {
		return nil, err
	}
	return e, nil
}
