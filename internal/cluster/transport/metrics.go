package transport

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

type metrics struct {
	accepted   *prometheus.CounterVec // by protocol: rpc, gossip
	refused    *prometheus.CounterVec // by reason: handshake, busy, protocol
	packetsIn  prometheus.Counter
	packetsOut prometheus.Counter
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		accepted: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "quill_cluster_connections_accepted_total",
			Help: "Node-to-node connections accepted after a mutual TLS handshake, by protocol (rpc, gossip).",
		}, []string{"protocol"}),
		refused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "quill_cluster_connections_refused_total",
			Help: "Connections to the cluster listener closed unserved, by reason: handshake (no valid certificate of the cluster, plaintext, no common protocol), busy (too many handshakes in progress).",
		}, []string{"reason"}),
		packetsIn: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "quill_cluster_packets_received_total",
			Help: "Gossip datagrams received (before memberlist decrypts them).",
		}),
		packetsOut: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "quill_cluster_packets_sent_total",
			Help: "Gossip datagrams sent.",
		}),
	}
	for _, r := range []string{"handshake", "busy", "protocol"} {
		m.refused.WithLabelValues(r)
	}
	if reg == nil {
		return m, nil
	}
	for _, c := range []prometheus.Collector{m.accepted, m.refused, m.packetsIn, m.packetsOut} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("transport: metrics: %w", err)
		}
	}
	return m, nil
}
