package metrics

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/tandemml/tandem/rpc"
)

// RPC returns a collector of an RPC agent's Metrics: outgoing calls and
// incoming requests by outcome, those in flight, refused connections,
// malformed frames, and a summary of outgoing call latencies (the count
// and sum over all calls, quantiles over the most recent 1024).
func RPC(a *rpc.Agent) prometheus.Collector {
	return newRPCCollector(a.Metrics)
}

func newRPCCollector(read func() rpc.Metrics) *rpcCollector {
	d := func(name, help string, labels ...string) *prometheus.Desc {
		return prometheus.NewDesc(name, help, labels, nil)
	}
	return &rpcCollector{read: read,
		calls:     d("tandem_rpc_calls_total", "Outgoing RPC calls, by state: sent (written to a connection), done (completed) and failed (completed with an error).", "state"),
		inFlight:  d("tandem_rpc_in_flight", "RPCs in flight, by direction: out (calls awaiting a reply) and in (requests being served).", "direction"),
		requests:  d("tandem_rpc_requests_total", "Incoming RPC requests, by state: served (answered) and failed (answered with an error).", "state"),
		refused:   d("tandem_rpc_connections_refused_total", "Connections refused at the handshake (token, TLS, hello)."),
		malformed: d("tandem_rpc_malformed_frames_total", "Connections closed for a malformed or oversized frame."),
		copies:    d("tandem_rpc_same_host_copies_total", "Frames whose tensors a peer on this host copied from this process's memory."),
		latency:   d("tandem_rpc_call_duration_seconds", "Latency of outgoing calls, from the call to its completion."),
	}
}

type rpcCollector struct {
	read                               func() rpc.Metrics
	calls, inFlight, requests, refused *prometheus.Desc
	malformed, copies, latency         *prometheus.Desc
}

func (c *rpcCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.calls, c.inFlight, c.requests, c.refused, c.malformed, c.copies, c.latency} {
		ch <- d
	}
}

func (c *rpcCollector) Collect(ch chan<- prometheus.Metric) {
	m := c.read()
	counter := func(d *prometheus.Desc, v int64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), labels...)
	}
	counter(c.calls, m.CallsSent, "sent")
	counter(c.calls, m.CallsDone, "done")
	counter(c.calls, m.CallsFailed, "failed")
	ch <- prometheus.MustNewConstMetric(c.inFlight, prometheus.GaugeValue, float64(m.CallsInFlight), "out")
	ch <- prometheus.MustNewConstMetric(c.inFlight, prometheus.GaugeValue, float64(m.RequestsInFlight), "in")
	counter(c.requests, m.RequestsServed, "served")
	counter(c.requests, m.RequestsFailed, "failed")
	counter(c.refused, m.ConnectionsRefused)
	counter(c.malformed, m.MalformedFrames)
	counter(c.copies, m.SameHostCopies)
	l := m.Latency
	q := map[float64]float64{}
	if l.Count > 0 {
		q[0.5], q[0.9], q[0.99] = l.P50.Seconds(), l.P90.Seconds(), l.P99.Seconds()
	}
	ch <- prometheus.MustNewConstSummary(c.latency, uint64(l.Count), l.Mean.Seconds()*float64(l.Count), q)
}
