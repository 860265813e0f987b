package server

import (
	"context"
	"errors"
	"fmt"
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
//
// A Cassandra keyspace holds the mailboxes of one engine mode (ADR 0026,
// ADR 0031): OpenStore returns the view of the mode the keyspace records,
// the batch mode's (*cassandra.Batches) for a keyspace claimed by `quill
// cluster init` or a cluster node, else the engine itself (the ordered
// mode, which its first mailbox call claims). So every process on one
// keyspace, server or admin command, reads and writes the same tables.
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
		MaildropLease: c.MaildropLease.Duration, ConnsPerHost: c.ConnectionsPerHost,
		Replication: map[string]string{"class": c.ReplicationClass},
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
	mode, err := e.Mode(ctx)
	if err != nil {
		e.Close()
		return nil, err
	}
	if mode == cassandra.ModeBatches {
		return e.Batches(), nil
	}
	return e, nil
}

// The messages a node gives when the keyspace's mode does not fit it; the
// errors wrap cassandra.ErrModeMismatch (a store.ErrConflict).
const (
	errOrderedForCluster = "cassandra keyspace %s holds mailboxes in the ordered mode (written by nodes without the cluster, one LWT ordering each change); " +
		"a node with the cluster on writes in the batch mode, and the two never mix on one keyspace: " +
		"run the nodes without --cluster-addr, or give the cluster a new keyspace ([store.cassandra] keyspace; `quill cluster init --config FILE` claims it for the batch mode)"
	errBatchesWithoutCluster = "cassandra keyspace %s is in the batch mode (claimed by `quill cluster init` or a cluster node): " +
		"its mailboxes are written only by user managers under the cluster's ownership epochs; " +
		"start this node with --cluster-addr HOST:PORT (and --join a live node), or give a node without the cluster a keyspace of its own"
)

// fitStoreMode checks that the engine's mode fits the node (ADR 0031) and
// returns the engine the node runs on. With the cluster on, a Cassandra
// keyspace must be in the batch mode, or in none yet, which claim (called
// once the cluster has started) records; an ordered keyspace is refused.
// Without the cluster, a keyspace in the batch mode is refused: its
// writers must hold ownership epochs, which only the cluster hands out.
// Any other engine passes unchanged.
func fitStoreMode(ctx context.Context, e store.Engine, keyspace string, clusterOn bool) (fit store.Engine, claim func(context.Context) error, err error) {
	none := func(context.Context) error { return nil }
	switch st := e.(type) {
	case *cassandra.Batches:
		if !clusterOn {
			return nil, nil, fmt.Errorf(errBatchesWithoutCluster+": %w", keyspace, cassandra.ErrModeMismatch)
		}
		return st, none, nil
	case *cassandra.Engine:
		if !clusterOn {
			return st, none, nil
		}
		mode, err := st.Mode(ctx)
		if err != nil {
			return nil, nil, err
		}
		switch mode {
		case cassandra.ModeBatches:
			return st.Batches(), none, nil
		case cassandra.ModeNone:
			claim := func(ctx context.Context) error {
				if err := st.ClaimMode(ctx, cassandra.ModeBatches); err != nil {
					if errors.Is(err, cassandra.ErrModeMismatch) {
						return fmt.Errorf(errOrderedForCluster+": %w", keyspace, err)
					}
					return err
				}
				return nil
			}
			return st.Batches(), claim, nil
		default:
			return nil, nil, fmt.Errorf(errOrderedForCluster+": %w", keyspace, cassandra.ErrModeMismatch)
		}
	}
	return e, none, nil
}

// ClaimClusterMode makes the engine fit a cluster (`quill cluster init`,
// ADR 0031): a Cassandra keyspace with no mode is claimed for the batch
// mode; one in the batch mode passes; one of the ordered mode, written by
// nodes without the cluster, is refused, for nothing converts one mode to
// the other. It returns what it found or did, "" for an engine of one
// mode (the embedded one).
func ClaimClusterMode(ctx context.Context, e any, keyspace string) (string, error) {
	switch st := e.(type) {
	case *cassandra.Batches:
		return fmt.Sprintf("cassandra keyspace %s is in the batch mode", keyspace), nil
	case *cassandra.Engine:
		err := st.ClaimMode(ctx, cassandra.ModeBatches)
		if errors.Is(err, cassandra.ErrModeMismatch) {
			return "", fmt.Errorf(errOrderedForCluster+": %w", keyspace, err)
		}
		if err != nil {
			return "", fmt.Errorf("claiming the batch mode for cassandra keyspace %s: %w", keyspace, err)
		}
		return fmt.Sprintf("cassandra keyspace %s claimed for the batch mode", keyspace), nil
	}
	return "", nil
}

// directoryTTL is the delivery agent's directory cache lifetime
// (config.Delivery.DirectoryTTL): zero picks the engine's default.
func directoryTTL(cfg config.Config) time.Duration {
	switch ttl := cfg.Delivery.DirectoryTTL.Duration; {
	case ttl < 0:
		return 0
	case ttl > 0:
		return ttl
	case cfg.Store.Engine == "cassandra":
		return 5 * time.Second
	}
	return 0
}
