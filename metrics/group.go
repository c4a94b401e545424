package metrics

import (
	"maps"
	"regexp"
	"strconv"
	"strings"
	"sync"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tandemml/tandem/comm"
)

// Group returns a collector of the collectives, sends and receives of
// pg's world on this rank (pg, its subgroups or its parent: every group
// the flight recorder holds), labelled by group name and kind (all_reduce,
// ..., send, recv). Each operation is counted once it has ended, whatever
// still runs before it. Give one Group per world: two would report the
// same series.
func Group(pg *comm.ProcessGroup) prometheus.Collector {
	return newGroupCollector(pg.FlightRecord)
}

type groupCollector struct {
	record func() comm.FlightRecord

	mu       sync.Mutex
	counted  map[uint32]*counted // by group id
	ops      *prometheus.CounterVec
	bytes    *prometheus.CounterVec
	size     *prometheus.HistogramVec
	latency  *prometheus.HistogramVec
	recorded *prometheus.Desc
}

func newGroupCollector(record func() comm.FlightRecord) *groupCollector {
	labels := []string{"group", "kind"}
	return &groupCollector{
		record:  record,
		counted: map[uint32]*counted{},
		ops: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "tandem_collectives_total",
			Help: "Collectives finished, by group, kind and state (done or failed)."}, []string{"group", "kind", "state"}),
		bytes: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "tandem_collective_bytes_total",
			Help: "Bytes of the tensors of the finished collectives, by group and kind."}, labels),
		size: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "tandem_collective_bytes",
			Help:    "Bytes of each finished collective's tensors, by group and kind.",
			Buckets: prometheus.ExponentialBuckets(64, 4, 13)}, labels), // 64 B to 1 GiB
		latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "tandem_collective_duration_seconds",
			Help:    "Time from each finished collective's start to its end, by group and kind.",
			Buckets: prometheus.ExponentialBuckets(1e-5, 4, 12)}, labels), // 10 µs to 42 s
		recorded: prometheus.NewDesc("tandem_collective_ops_recorded_total",
			"Collectives the flight recorder recorded, by group, including those still running and those that left its ring before a scrape.",
			[]string{"group"}, nil),
	}
}

func (c *groupCollector) Describe(ch chan<- *prometheus.Desc) {
	c.ops.Describe(ch)
	c.bytes.Describe(ch)
	c.size.Describe(ch)
	c.latency.Describe(ch)
	ch <- c.recorded
}

// counted is what a group's collector has counted of its flight record:
// every record before next, and those at or after it in done (records
// that ended while an earlier one still ran).
type counted struct {
	next uint64
	done map[uint64]bool
}

func (c *groupCollector) Collect(ch chan<- prometheus.Metric) {
	rec := c.record()
	c.mu.Lock()
	for _, g := range rec.Groups {
		ch <- prometheus.MustNewConstMetric(c.recorded, prometheus.CounterValue, float64(g.Recorded), g.Name)
		k := c.counted[g.ID]
		if k == nil {
			k = &counted{next: 1, done: map[uint64]bool{}}
			c.counted[g.ID] = k
		}
		if len(g.Ops) > 0 && g.Ops[0].Ord > k.next {
			// The ring moved past records that never ended in a scrape.
			k.next = g.Ops[0].Ord
			maps.DeleteFunc(k.done, func(ord uint64, _ bool) bool { return ord < k.next })
		}
		for _, op := range g.Ops {
			if op.Ord < k.next || k.done[op.Ord] || op.State != "done" && op.State != "failed" {
				continue
			}
			c.observe(g.Name, op)
			k.done[op.Ord] = true
		}
		for k.done[k.next] {
			delete(k.done, k.next)
			k.next++
		}
	}
	c.mu.Unlock()
	c.ops.Collect(ch)
	c.bytes.Collect(ch)
	c.size.Collect(ch)
	c.latency.Collect(ch)
}

// kindLabel is op's kind without arguments: the object collectives name
// their steps with their root and size, e.g.
// broadcast_object_payload(root=0,96 bytes), which would make a series of
// every size.
func kindLabel(kind string) string {
	if i := strings.IndexByte(kind, '('); i >= 0 {
		return kind[:i]
	}
	return kind
}

func (c *groupCollector) observe(group string, op comm.FlightOp) {
	op.Kind = kindLabel(op.Kind)
	c.ops.WithLabelValues(group, op.Kind, op.State).Inc()
	if op.State != "done" {
		return
	}
	if n, ok := descBytes(op.Desc); ok {
		c.bytes.WithLabelValues(group, op.Kind).Add(float64(n))
		c.size.WithLabelValues(group, op.Kind).Observe(float64(n))
	}
	start := op.Started
	if start.IsZero() {
		start = op.Enqueued
	}
	if !op.Ended.IsZero() && !start.IsZero() {
		c.latency.WithLabelValues(group, op.Kind).Observe(op.Ended.Sub(start).Seconds())
	}
}

var payloadBytes = regexp.MustCompile(`[(,](\d+) bytes\)$`)

var dtypeSizes = map[string]int64{"float32": 4, "float64": 8, "int8": 1, "uint8": 1, "int32": 4, "int64": 8, "float16": 2, "bfloat16": 2}

// descBytes reads the bytes of the tensors a collective's fingerprint
// names, e.g. all_reduce(float32,[4],sum) holds 16 and
// all_reduce_coalesced(float64,[2];[3,4],sum) 112, or the size an object
// collective's payload gives, as in all_gather_object_payload(96 bytes).
// It reports false for descriptions without either (barrier()), or cut
// short.
func descBytes(desc string) (int64, bool) {
	open := strings.IndexByte(desc, '(')
	if open < 0 || strings.Contains(desc, "...#") {
		return 0, false
	}
	if m := payloadBytes.FindStringSubmatch(desc); m != nil {
		n, err := strconv.ParseInt(m[1], 10, 64)
		return n, err == nil
	}
	rest := desc[open+1:]
	comma := strings.IndexByte(rest, ',')
	if comma < 0 {
		return 0, false
	}
	size, ok := dtypeSizes[rest[:comma]]
	if !ok {
		return 0, false
	}
	var total int64
	found := false
	for {
		i := strings.IndexByte(rest, '[')
		if i < 0 {
			break
		}
		j := strings.IndexByte(rest[i:], ']')
		if j < 0 {
			return 0, false
		}
		n := int64(1)
		if dims := rest[i+1 : i+j]; dims != "" {
			for _, d := range strings.Split(dims, ",") {
				v, err := strconv.ParseInt(d, 10, 64)
				if err != nil || v < 0 {
					return 0, false
				}
				n *= v
			}
		}
		total += n * size
		found = true
		rest = rest[i+j+1:]
	}
	return total, found
}
