package cassandra

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	gocql "github.com/apache/cassandra-gocql-driver/v2"

	"quill/internal/store"
)

var _ store.Ownership = (*Engine)(nil)

// decodeMembers parses cluster_maps.members (store.EncodeMembers).
func decodeMembers(epoch int64, b []byte) (store.ClusterMap, error) {
	m, err := store.DecodeMembers(uint64(epoch), b)
	if err != nil {
		return store.ClusterMap{}, fmt.Errorf("cassandra: stored cluster map: %w", err)
	}
	return m, nil
}

// LatestClusterMap implements store.Ownership with a read at the read
// consistency: a map whose LWT committed is seen; one whose LWT is still
// in progress is seen once the next LWT or serial read on the partition
// completes it, which only delays its adoption.
func (e *Engine) LatestClusterMap(ctx context.Context) (store.ClusterMap, error) {
	var (
		epoch   int64
		members []byte
	)
	err := e.read(ctx, `SELECT epoch, members FROM cluster_maps WHERE k = 0 ORDER BY epoch DESC LIMIT 1`).Scan(&epoch, &members)
	if err != nil {
		return store.ClusterMap{}, wrap("reading the latest cluster map", err)
	}
	return decodeMembers(epoch, members)
}

// ClusterMapAt implements store.Ownership with a serial read, which
// completes a proposal in progress, so that its answer is final.
func (e *Engine) ClusterMapAt(ctx context.Context, epoch uint64) (store.ClusterMap, error) {
	var members []byte
	err := e.serialRead(ctx, `SELECT members FROM cluster_maps WHERE k = 0 AND epoch = ?`, int64(epoch)).Scan(&members)
	if err != nil {
		return store.ClusterMap{}, wrap(fmt.Sprintf("reading the cluster map of epoch %d", epoch), err)
	}
	return decodeMembers(int64(epoch), members)
}

// PruneClusterMaps implements store.Ownership with one range deletion in
// the maps' partition.
func (e *Engine) PruneClusterMaps(ctx context.Context, below uint64) error {
	return wrap("pruning cluster maps", e.write(ctx, `DELETE FROM cluster_maps WHERE k = 0 AND epoch < ?`, int64(below)).Exec())
}

// ProposeClusterMap implements store.Ownership with one LWT, INSERT ... IF
// NOT EXISTS on the epoch's row. When its outcome is unknown, a serial read
// says whether the row holds this map.
func (e *Engine) ProposeClusterMap(ctx context.Context, m store.ClusterMap) error {
	if err := store.CheckClusterMap(m); err != nil {
		return err
	}
	b, err := store.EncodeMembers(m.Members)
	if err != nil {
		return err
	}
	applied, err := e.cas(ctx, `INSERT INTO cluster_maps (k, epoch, members, proposed) VALUES (0, ?, ?, ?) IF NOT EXISTS`,
		int64(m.Epoch), b, time.Now()).MapScanCAS(map[string]any{})
	if err != nil {
		stored, rerr := e.ClusterMapAt(ctx, m.Epoch)
		switch {
		case rerr == nil && slices.Equal(stored.Members, m.Members):
			return nil
		case rerr == nil:
			return fmt.Errorf("cluster map of epoch %d: %w", m.Epoch, store.ErrExists)
		default:
			return wrap(fmt.Sprintf("proposing the cluster map of epoch %d", m.Epoch), fmt.Errorf("%w (then reading it: %w)", err, rerr))
		}
	}
	if !applied {
		return fmt.Errorf("cluster map of epoch %d: %w", m.Epoch, store.ErrExists)
	}
	return nil
}

// PutNodeLease implements store.Ownership with one ordinary write, which
// lives store.LeaseRetention unless written again.
func (e *Engine) PutNodeLease(ctx context.Context, l store.NodeLease) error {
	if err := store.CheckNodeID(l.Node); err != nil {
		return err
	}
	err := e.write(ctx, `INSERT INTO node_leases (k, node, adopted, renewal, released) VALUES (0, ?, ?, ?, ?) USING TTL ?`,
		l.Node, int64(l.Adopted), int64(l.Renewal), l.Released, store.LeaseRetention).Exec()
	return wrap("writing the lease of node "+l.Node, err)
}

// NodeLeases implements store.Ownership: one partition read.
func (e *Engine) NodeLeases(ctx context.Context) ([]store.NodeLease, error) {
	it := e.read(ctx, `SELECT node, adopted, renewal, released FROM node_leases WHERE k = 0`).Iter()
	var (
		out              []store.NodeLease
		node             string
		adopted, renewal int64
		released         bool
	)
	for it.Scan(&node, &adopted, &renewal, &released) {
		out = append(out, store.NodeLease{Node: node, Adopted: uint64(adopted), Renewal: uint64(renewal), Released: released})
	}
	if err := it.Close(); err != nil && !errors.Is(err, gocql.ErrNotFound) {
		return nil, wrap("reading node leases", err)
	}
	return out, nil
}
