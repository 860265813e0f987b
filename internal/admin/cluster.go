package admin

import (
	"context"
	"net/http"
)

// Cluster is what the API exposes of the node's cluster (nil: the node
// runs alone).
type Cluster interface {
	Status(ctx context.Context) (ClusterStatus, error)
	// Drain marks node draining, or back in service, and returns its
	// state afterwards.
	Drain(ctx context.Context, node string, draining bool) (string, error)
}

// ClusterStatus is GET /api/cluster, and `quill cluster status --json`.
type ClusterStatus struct {
	// Self is the ID of the node that answered.
	Self string `json:"self"`
	// Buckets is the number of buckets in the cluster; the nodes'
	// buckets sum to it while a live node is not draining.
	Buckets int `json:"buckets"`
	// Epoch is the newest map epoch the answering node has read (ADR
	// 0024).
	Epoch uint64        `json:"epoch"`
	Nodes []ClusterNode `json:"nodes"`
}

// ClusterNode is one node of ClusterStatus.
type ClusterNode struct {
	ID      string `json:"id"`
	Addr    string `json:"addr"`
	State   string `json:"state"` // alive, suspect, dead, draining
	Buckets int    `json:"buckets"`
	// Load as the node reported it; null when it is dead or did not
	// answer (Error says why).
	Load  *NodeLoad `json:"load"`
	Error string    `json:"error,omitempty"`
	// Epoch is the map epoch the node has adopted (its lease row), Lease
	// its lease as the answering node sees it: held, expired, released,
	// unseen (renewed lately, not yet known current) or none.
	Epoch uint64 `json:"epoch"`
	Lease string `json:"lease"`
	// Managed is the number of buckets the node manages now; only the
	// answering node reports its own.
	Managed *int `json:"managed,omitempty"`
}

// NodeLoad is a node's load (internal/cluster.Load).
type NodeLoad struct {
	Sessions int     `json:"sessions"`
	CPU      float64 `json:"cpu"`
	// Overloaded: the node refuses new client connections.
	Overloaded bool `json:"overloaded"`
}

// DrainRequest is POST /api/cluster/drain.
type DrainRequest struct {
	Node     string `json:"node"`
	Draining bool   `json:"draining"`
}

// DrainReply answers it.
type DrainReply struct {
	Node  string `json:"node"`
	State string `json:"state"`
}

// clusterOff: the API was asked about a cluster on a node that runs
// alone.
const clusterOff = "this node runs without a cluster (cluster.addr / --cluster-addr is off)"

func (a *api) clusterStatus(w http.ResponseWriter, r *http.Request) {
	if a.c == nil {
		writeJSON(w, http.StatusConflict, apiError{clusterOff, "cluster_off"})
		return
	}
	st, err := a.c.Status(r.Context())
	if err != nil {
		a.fail(w, err)
		return
	}
	writeJSON(w, http.StatusOK, st)
}

func (a *api) clusterDrain(w http.ResponseWriter, r *http.Request) {
	if a.c == nil {
		writeJSON(w, http.StatusConflict, apiError{clusterOff, "cluster_off"})
		return
	}
	var req DrainRequest
	if err := decode(r, &req); err != nil {
		a.fail(w, err)
		return
	}
	state, err := a.c.Drain(r.Context(), req.Node, req.Draining)
	if err != nil {
		a.fail(w, err)
		return
	}
	writeJSON(w, http.StatusOK, DrainReply{Node: req.Node, State: state})
}

// ClusterStatus calls GET /api/cluster.
func (c *Client) ClusterStatus(ctx context.Context) (ClusterStatus, error) {
	var st ClusterStatus
	err := c.do(ctx, "GET", "/api/cluster", nil, &st)
	return st, err
}

// Drain calls POST /api/cluster/drain.
func (c *Client) Drain(ctx context.Context, node string, draining bool) (DrainReply, error) {
	var out DrainReply
	err := c.do(ctx, "POST", "/api/cluster/drain", DrainRequest{Node: node, Draining: draining}, &out)
	return out, err
}
