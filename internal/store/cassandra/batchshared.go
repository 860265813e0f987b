package cassandra

import (
	"context"

	"quill/internal/store"
)

// The contracts beside store.Engine that do not depend on the mode are the
// engine's: a server in the batch mode holds only the *Batches view, and
// its cluster reads credentials (store.Secrets) and the ownership tables
// (store.Ownership) through it. Neither touches a mailbox, so neither
// claims the keyspace's mode.
var (
	_ store.Secrets   = (*Batches)(nil)
	_ store.Ownership = (*Batches)(nil)
)

// Engine returns the engine the view belongs to.
func (b *Batches) Engine() *Engine { return b.e }

func (b *Batches) CreateSecret(ctx context.Context, name string, value []byte) error {
	return b.e.CreateSecret(ctx, name, value)
}

func (b *Batches) GetSecret(ctx context.Context, name string) ([]byte, error) {
	return b.e.GetSecret(ctx, name)
}

func (b *Batches) LatestClusterMap(ctx context.Context) (store.ClusterMap, error) {
	return b.e.LatestClusterMap(ctx)
}

func (b *Batches) ClusterMapAt(ctx context.Context, epoch uint64) (store.ClusterMap, error) {
	return b.e.ClusterMapAt(ctx, epoch)
}

func (b *Batches) ProposeClusterMap(ctx context.Context, m store.ClusterMap) error {
	return b.e.ProposeClusterMap(ctx, m)
}

func (b *Batches) PruneClusterMaps(ctx context.Context, below uint64) error {
	return b.e.PruneClusterMaps(ctx, below)
}

func (b *Batches) PutNodeLease(ctx context.Context, l store.NodeLease) error {
	return b.e.PutNodeLease(ctx, l)
}

func (b *Batches) NodeLeases(ctx context.Context) ([]store.NodeLease, error) {
	return b.e.NodeLeases(ctx)
}
