package server

import (
	"context"

	"quill/internal/admin"
	"quill/internal/cluster"
)

// clusterAPI is the admin API's view of this node's cluster.
type clusterAPI struct{ n *cluster.Node }

// clusterAdmin returns the admin API's cluster, nil with the cluster off.
func clusterAdmin(n *cluster.Node) admin.Cluster {
	if n == nil {
		return nil
	}
	return clusterAPI{n}
}

func (c clusterAPI) Status(ctx context.Context) (admin.ClusterStatus, error) {
	st := c.n.Status(ctx)
	out := admin.ClusterStatus{Self: st.Self, Buckets: st.Buckets, Epoch: st.Epoch, Nodes: make([]admin.ClusterNode, len(st.Nodes))}
	for i, n := range st.Nodes {
		out.Nodes[i] = admin.ClusterNode{ID: n.ID, Addr: n.Addr, State: string(n.State), Buckets: n.Buckets, Error: n.Error,
			Epoch: n.Adopted, Lease: n.Lease}
		if n.Self {
			managed := n.Managed
			out.Nodes[i].Managed = &managed
		}
		if n.Load != nil {
			out.Nodes[i].Load = &admin.NodeLoad{Sessions: n.Load.Sessions, CPU: n.Load.CPU, Overloaded: n.Load.Overloaded}
		}
	}
	return out, nil
}

func (c clusterAPI) Drain(ctx context.Context, node string, draining bool) (string, error) {
	st, err := c.n.Drain(ctx, node, draining)
	return string(st), err
}
