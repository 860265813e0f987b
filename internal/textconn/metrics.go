package textconn

import (
	"github.com/prometheus/client_golang/prometheus"
)

// Metrics are the front-end metrics shared by every protocol, one set per
// listener (const label listener=<name>). All methods are safe for
// concurrent use and are no-ops on a nil *Metrics.
type Metrics struct {
	connections   prometheus.Counter
	active        prometheus.Gauge
	rejected      prometheus.Counter
	commands      *prometheus.CounterVec
	commandErrors *prometheus.CounterVec
	bytesIn       prometheus.Counter
	bytesOut      prometheus.Counter
}

// NewMetrics creates the metrics of one listener and registers them with
// reg; with a nil reg they are kept but unregistered. Registering two
// listeners with the same name on one registry panics, as prometheus does
// for any duplicate.
func NewMetrics(reg prometheus.Registerer, listener string) *Metrics {
	labels := prometheus.Labels{"listener": listener}
	m := &Metrics{
		connections: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "quill_connections_total", ConstLabels: labels,
			Help: "Connections accepted.",
		}),
		active: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "quill_connections_active", ConstLabels: labels,
			Help: "Connections being served.",
		}),
		rejected: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "quill_connections_rejected_total", ConstLabels: labels,
			Help: "Connections refused because a connection limit was reached or the node was overloaded.",
		}),
		commands: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "quill_commands_total", ConstLabels: labels,
			Help: "Protocol commands received, by command.",
		}, []string{"command"}),
		commandErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "quill_command_errors_total", ConstLabels: labels,
			Help: "Protocol commands answered with an error, by command.",
		}, []string{"command"}),
		bytesIn: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "quill_bytes_received_total", ConstLabels: labels,
			Help: "Bytes received on the wire, TLS records included.",
		}),
		bytesOut: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "quill_bytes_sent_total", ConstLabels: labels,
			Help: "Bytes sent on the wire, TLS records included.",
		}),
	}
	if reg != nil {
		reg.MustRegister(m.connections, m.active, m.rejected, m.commands,
			m.commandErrors, m.bytesIn, m.bytesOut)
	}
	return m
}

// Command counts one command. The caller must pass a name from the
// protocol's fixed vocabulary (an unknown verb as "unknown"): the label's
// cardinality must not be client-controlled.
func (m *Metrics) Command(name string) {
	if m != nil {
		m.commands.WithLabelValues(name).Inc()
	}
}

// CommandError counts one command answered with an error; the name rule of
// Command applies.
func (m *Metrics) CommandError(name string) {
	if m != nil {
		m.commandErrors.WithLabelValues(name).Inc()
	}
}

func (m *Metrics) opened() {
	if m != nil {
		m.connections.Inc()
		m.active.Inc()
	}
}

func (m *Metrics) closed() {
	if m != nil {
		m.active.Dec()
	}
}

func (m *Metrics) reject() {
	if m != nil {
		m.rejected.Inc()
	}
}

func (m *Metrics) received(n int) {
	if m != nil && n > 0 {
		m.bytesIn.Add(float64(n))
	}
}

func (m *Metrics) sent(n int) {
	if m != nil && n > 0 {
		m.bytesOut.Add(float64(n))
	}
}
