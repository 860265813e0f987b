package store

import (
	"context"
	"encoding/json"
	"fmt"
)

// Ownership is what the cluster's ownership protocol (docs/adr/0024,
// 0027; internal/cluster/ownership) keeps in the store: the map epochs,
// each a membership of the cluster that the user map is a pure function
// of, and one lease row per node. It is a contract of its own, beside
// Store, because nothing about mail uses it. Both engines implement it;
// storetest checks them.
//
// Invariants every implementation keeps, across every process sharing
// the store:
//   - Each epoch has at most one map, and once stored it never changes:
//     of any number of concurrent ProposeClusterMap calls for one epoch,
//     in any number of processes, at most one succeeds.
//   - A map whose ProposeClusterMap returned nil is returned by every
//     later LatestClusterMap (or one of a higher epoch) and ClusterMapAt.
//   - A lease row is one node's alone: only that node writes it, with
//     ordinary (not conditional) writes; a reader sees the last write that
//     completed before its read began, or a later one.
type Ownership interface {
	// LatestClusterMap returns the map of the highest epoch stored, or
	// ErrNotFound when none is.
	LatestClusterMap(ctx context.Context) (ClusterMap, error)
	// ClusterMapAt returns the map of epoch, or ErrNotFound.
	ClusterMapAt(ctx context.Context, epoch uint64) (ClusterMap, error)
	// ProposeClusterMap stores m if no map of m.Epoch is stored, with one
	// conditional write, and fails with ErrExists otherwise. Callers
	// propose the latest epoch they read plus one, so that epochs stay
	// dense; the store does not check it. A call that fails otherwise (a
	// timeout) may or may not have stored m: ClusterMapAt tells.
	ProposeClusterMap(ctx context.Context, m ClusterMap) error
	// PruneClusterMaps deletes the maps of the epochs below below. The
	// caller keeps every epoch a lease row still names (ownership's
	// handoff reads them) and proposes only above the newest: a pruned
	// epoch is never proposed again.
	PruneClusterMaps(ctx context.Context, below uint64) error
	// PutNodeLease writes l as its node's lease row, replacing the one
	// before.
	PutNodeLease(ctx context.Context, l NodeLease) error
	// NodeLeases returns every node's lease row, in no particular order.
	// Rows of nodes gone for long may be forgotten (LeaseRetention).
	NodeLeases(ctx context.Context) ([]NodeLease, error)
}

// ClusterMap is one map epoch: the members the user map of that epoch is
// computed from (internal/cluster/usermap.New).
type ClusterMap struct {
	Epoch   uint64
	Members []MapMember
}

// MapMember is one member of a ClusterMap.
type MapMember struct {
	ID       string
	Weight   uint32
	Draining bool
}

// NodeLease is a node's lease row.
type NodeLease struct {
	Node string
	// Adopted is the highest map epoch the node has adopted (0: none yet).
	Adopted uint64
	// Renewal changes with every write of the row, so that a reader can
	// tell a renewed lease from a stale one.
	Renewal uint64
	// Released: the node gave its lease up (a graceful stop) after it
	// stopped managing every bucket; readers need not wait for it to
	// expire.
	Released bool
}

// Limits of Ownership's values.
const (
	// MaxMapMembers bounds a ClusterMap's members (usermap.MaxMembers).
	MaxMapMembers = 1 << 16
	// MaxNodeID bounds a node ID's length; node IDs are 32 hex digits
	// (internal/cluster/membership) but the store only needs them short
	// and printable.
	MaxNodeID = 128
	// LeaseRetention is how long an engine keeps a lease row that is not
	// written again (a node gone for good): 24 hours.
	LeaseRetention = 24 * 60 * 60
	// MaxEpoch bounds map epochs: the fencing timestamps of ADR 0024 hold
	// an epoch in 30 bits.
	MaxEpoch = 1 << 30
)

// CheckClusterMap reports, as ErrInvalid, a map ProposeClusterMap must
// refuse: epoch 0, no member, too many, a malformed or repeated ID.
func CheckClusterMap(m ClusterMap) error {
	if m.Epoch == 0 || m.Epoch >= MaxEpoch {
		return fmt.Errorf("%w: cluster map epoch %d", ErrInvalid, m.Epoch)
	}
	if len(m.Members) == 0 || len(m.Members) > MaxMapMembers {
		return fmt.Errorf("%w: cluster map of %d members", ErrInvalid, len(m.Members))
	}
	seen := make(map[string]bool, len(m.Members))
	for _, mb := range m.Members {
		if err := CheckNodeID(mb.ID); err != nil {
			return err
		}
		if seen[mb.ID] {
			return fmt.Errorf("%w: cluster map lists node %s twice", ErrInvalid, mb.ID)
		}
		seen[mb.ID] = true
	}
	return nil
}

// CheckNodeID reports, as ErrInvalid, an empty, over-long or unprintable
// node ID.
func CheckNodeID(id string) error {
	if id == "" || len(id) > MaxNodeID {
		return fmt.Errorf("%w: node ID of %d bytes", ErrInvalid, len(id))
	}
	for i := 0; i < len(id); i++ {
		if id[i] <= ' ' || id[i] > '~' {
			return fmt.Errorf("%w: node ID %q is not printable ASCII", ErrInvalid, id)
		}
	}
	return nil
}

// wireMember is a MapMember in EncodeMembers' JSON.
type wireMember struct {
	ID       string `json:"id"`
	Weight   uint32 `json:"w"`
	Draining bool   `json:"d,omitempty"`
}

// EncodeMembers encodes a map's members as an engine may store them: a
// JSON array, so that a field added later is ignored by older readers.
func EncodeMembers(ms []MapMember) ([]byte, error) {
	w := make([]wireMember, len(ms))
	for i, m := range ms {
		w[i] = wireMember{ID: m.ID, Weight: m.Weight, Draining: m.Draining}
	}
	return json.Marshal(w)
}

// DecodeMembers parses EncodeMembers' form into the map of epoch. Bytes
// that do not decode to a valid map (CheckClusterMap) are an error, never
// a partial map.
func DecodeMembers(epoch uint64, b []byte) (ClusterMap, error) {
	var w []wireMember
	if err := json.Unmarshal(b, &w); err != nil {
		return ClusterMap{}, fmt.Errorf("%w: cluster map of epoch %d: %v", ErrInvalid, epoch, err)
	}
	m := ClusterMap{Epoch: epoch, Members: make([]MapMember, len(w))}
	for i, x := range w {
		m.Members[i] = MapMember{ID: x.ID, Weight: x.Weight, Draining: x.Draining}
	}
	if err := CheckClusterMap(m); err != nil {
		return ClusterMap{}, err
	}
	return m, nil
}
