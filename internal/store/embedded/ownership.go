package embedded

import (
	"context"
	"fmt"
	"slices"
	"sync"

	"quill/internal/store"
)

var _ store.Ownership = (*Engine)(nil)

// ownership is store.Ownership for the embedded engine, in memory. One
// process opens the engine, so every node sharing it runs in that process
// (in-process cluster tests: the configuration refuses a cluster on it), and
// a mutex orders them as Cassandra's conditional write orders processes.
// Nothing of it needs to outlive the process: the user managers that
// answer to it start afresh too, and the engine ignores batch epochs.
type ownership struct {
	mu     sync.Mutex
	maps   map[uint64]store.ClusterMap
	latest uint64
	leases map[string]store.NodeLease
}

func cloneMap(m store.ClusterMap) store.ClusterMap {
	m.Members = slices.Clone(m.Members)
	return m
}

// LatestClusterMap implements store.Ownership.
func (e *Engine) LatestClusterMap(ctx context.Context) (store.ClusterMap, error) {
	o := &e.owner
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.latest == 0 {
		return store.ClusterMap{}, fmt.Errorf("cluster map: %w", store.ErrNotFound)
	}
	return cloneMap(o.maps[o.latest]), nil
}

// ClusterMapAt implements store.Ownership.
func (e *Engine) ClusterMapAt(ctx context.Context, epoch uint64) (store.ClusterMap, error) {
	o := &e.owner
	o.mu.Lock()
	defer o.mu.Unlock()
	m, ok := o.maps[epoch]
	if !ok {
		return store.ClusterMap{}, fmt.Errorf("cluster map of epoch %d: %w", epoch, store.ErrNotFound)
	}
	return cloneMap(m), nil
}

// ProposeClusterMap implements store.Ownership.
func (e *Engine) ProposeClusterMap(ctx context.Context, m store.ClusterMap) error {
	if err := store.CheckClusterMap(m); err != nil {
		return err
	}
	o := &e.owner
	o.mu.Lock()
	defer o.mu.Unlock()
	if _, ok := o.maps[m.Epoch]; ok {
		return fmt.Errorf("cluster map of epoch %d: %w", m.Epoch, store.ErrExists)
	}
	if o.maps == nil {
		o.maps = map[uint64]store.ClusterMap{}
	}
	o.maps[m.Epoch] = cloneMap(m)
	o.latest = max(o.latest, m.Epoch)
	return nil
}

// PruneClusterMaps implements store.Ownership.
func (e *Engine) PruneClusterMaps(ctx context.Context, below uint64) error {
	o := &e.owner
	o.mu.Lock()
	defer o.mu.Unlock()
	for epoch := range o.maps {
		if epoch < below {
			delete(o.maps, epoch)
		}
	}
	return nil
}

// PutNodeLease implements store.Ownership.
func (e *Engine) PutNodeLease(ctx context.Context, l store.NodeLease) error {
	if err := store.CheckNodeID(l.Node); err != nil {
		return err
	}
	o := &e.owner
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.leases == nil {
		o.leases = map[string]store.NodeLease{}
	}
	o.leases[l.Node] = l
	return nil
}

// NodeLeases implements store.Ownership.
func (e *Engine) NodeLeases(ctx context.Context) ([]store.NodeLease, error) {
	o := &e.owner
	o.mu.Lock()
	defer o.mu.Unlock()
	out := make([]store.NodeLease, 0, len(o.leases))
	for _, l := range o.leases {
		out = append(out, l)
	}
	return out, nil
}
