package rpc

import (
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// Metrics is a snapshot of an agent's counters.
type Metrics struct {
	CallsInFlight int64 // outgoing calls awaiting their reply
	CallsSent     int64 // outgoing calls written to a connection
	CallsDone     int64 // outgoing calls completed (with or without error)
	CallsFailed   int64 // outgoing calls that ended with an error

	RequestsInFlight int64 // incoming calls being served
	RequestsServed   int64 // incoming calls answered (with or without error)
	RequestsFailed   int64 // incoming calls answered with an error

	ConnectionsRefused int64 // connections refused at the handshake (token, TLS, hello)
	MalformedFrames    int64 // connections closed for a malformed or oversized frame
	SameHostCopies     int64 // frames whose tensors the peer copied from this process's memory
	PushedTensors      int64 // tensors this process wrote in part into the peer's memory itself (WithPush)

	// Latency of outgoing calls, from the call to its completion: the mean
	// over all calls, and quantiles over the most recent ones.
	Latency LatencyStats
}

// LatencyStats summarizes call latencies.
type LatencyStats struct {
	Count         int64
	Mean          time.Duration
	P50, P90, P99 time.Duration
	Max           time.Duration // of the recent window
}

const latencyWindow = 1024

type metrics struct {
	clientInFlight atomic.Int64
	serverInFlight atomic.Int64
	held           atomic.Int64
	sent           atomic.Int64
	received       atomic.Int64
	done           atomic.Int64
	failed         atomic.Int64
	served         atomic.Int64
	serveFailed    atomic.Int64
	refused        atomic.Int64
	malformed      atomic.Int64
	byRef          atomic.Int64
	pushed         atomic.Int64

	mu      sync.Mutex
	ring    []time.Duration
	next    int
	count   int64
	sumNano float64
}

func (m *metrics) init() { m.ring = make([]time.Duration, 0, latencyWindow) }

func (m *metrics) callStart() { m.clientInFlight.Add(1) }

func (m *metrics) callDone(d time.Duration, err error) {
	m.clientInFlight.Add(-1)
	m.done.Add(1)
	if err != nil {
		m.failed.Add(1)
	}
	m.mu.Lock()
	if len(m.ring) < latencyWindow {
		m.ring = append(m.ring, d)
	} else {
		m.ring[m.next] = d
		m.next = (m.next + 1) % latencyWindow
	}
	m.count++
	m.sumNano += float64(d)
	m.mu.Unlock()
}

func (m *metrics) requestStart() {
	m.serverInFlight.Add(1)
	m.received.Add(1)
}

func (m *metrics) requestDone(err error) {
	if err != nil {
		m.serveFailed.Add(1)
	}
	m.served.Add(1)
	m.serverInFlight.Add(-1)
}

// Metrics returns a snapshot of the agent's counters.
func (a *Agent) Metrics() Metrics {
	m := &a.m
	out := Metrics{
		CallsInFlight:      m.clientInFlight.Load(),
		CallsSent:          m.sent.Load(),
		CallsDone:          m.done.Load(),
		CallsFailed:        m.failed.Load(),
		RequestsInFlight:   m.serverInFlight.Load(),
		RequestsServed:     m.served.Load(),
		RequestsFailed:     m.serveFailed.Load(),
		ConnectionsRefused: m.refused.Load(),
		MalformedFrames:    m.malformed.Load(),
		SameHostCopies:     m.byRef.Load(),
		PushedTensors:      m.pushed.Load(),
	}
	m.mu.Lock()
	recent := slices.Clone(m.ring)
	out.Latency.Count = m.count
	if m.count > 0 {
		out.Latency.Mean = time.Duration(m.sumNano / float64(m.count))
	}
	m.mu.Unlock()
	if len(recent) > 0 {
		slices.Sort(recent)
		q := func(p float64) time.Duration { return recent[min(len(recent)-1, int(p*float64(len(recent))))] }
		out.Latency.P50, out.Latency.P90, out.Latency.P99 = q(0.50), q(0.90), q(0.99)
		out.Latency.Max = recent[len(recent)-1]
	}
	return out
}
