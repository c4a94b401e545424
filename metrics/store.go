package metrics

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tandemml/tandem/comm/store"
)

// StoreMetrics counts a TCP store client's operations, by operation and
// outcome, and keeps a histogram of their latencies. It is both the
// store.Observer to give the client (store.WithObserver, or
// comm.WithStoreOptions for the store comm.Init opens) and the collector
// to serve. One StoreMetrics may observe several clients: their
// operations add up.
type StoreMetrics struct {
	ops     *prometheus.CounterVec
	latency *prometheus.HistogramVec
}

var _ store.Observer = (*StoreMetrics)(nil)

// Store returns a StoreMetrics with no operations counted yet.
func Store() *StoreMetrics {
	return &StoreMetrics{
		ops: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "tandem_store_ops_total",
			Help: "Store operations completed, by operation (set, get, add, compare_set, wait, ...) and state (done or failed)."}, []string{"op", "state"}),
		latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "tandem_store_op_duration_seconds",
			Help:    "Time from each store operation's call to its reply, reconnects included, by operation.",
			Buckets: prometheus.ExponentialBuckets(2e-5, 4, 11)}, []string{"op"}), // 20 µs to 21 s
	}
}

// StoreOp implements store.Observer.
func (m *StoreMetrics) StoreOp(op string, d time.Duration, err error) {
	state := "done"
	if err != nil {
		state = "failed"
	}
	m.ops.WithLabelValues(op, state).Inc()
	m.latency.WithLabelValues(op).Observe(d.Seconds())
}

// Describe implements prometheus.Collector.
func (m *StoreMetrics) Describe(ch chan<- *prometheus.Desc) {
	m.ops.Describe(ch)
	m.latency.Describe(ch)
}

// Collect implements prometheus.Collector.
func (m *StoreMetrics) Collect(ch chan<- prometheus.Metric) {
	m.ops.Collect(ch)
	m.latency.Collect(ch)
}
