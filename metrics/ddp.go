package metrics

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/tandemml/tandem/ddp"
)

// StatsSource is what DDP reads: *ddp.DDP and *ddp.GraphDDP.
type StatsSource interface {
	Stats() ddp.Stats
}

// DDP returns a collector of a data-parallel model's Stats. Counters
// restart from zero when the model's ResetStats is called.
func DDP(m StatsSource) prometheus.Collector {
	d := func(name, help string) *prometheus.Desc { return prometheus.NewDesc(name, help, nil, nil) }
	return &ddpCollector{m: m,
		steps:       prometheus.NewDesc("tandem_ddp_steps_total", "DDP steps, by kind: sync (gradients all-reduced), no_sync (inside NoSync) and shadow (shadowed after Join).", []string{"kind"}, nil),
		stepTime:    d("tandem_ddp_step_seconds_total", "Time spent in DDP steps."),
		computeTime: d("tandem_ddp_forward_backward_seconds_total", "Time spent in the steps' forward and backward passes."),
		forward:     d("tandem_ddp_forward_seconds_total", "Time spent in the steps' forward passes, up to the loss (0 for GraphDDP under TapeMachine, which does not say when the loss is ready)."),
		backward:    d("tandem_ddp_backward_seconds_total", "Time spent in the steps' backward passes, from the loss to the last gradient (0 for GraphDDP under TapeMachine)."),
		commTime:    d("tandem_ddp_communication_seconds_total", "Time during which at least one gradient bucket's reduction was in flight."),
		overlapTime: d("tandem_ddp_overlapped_seconds_total", "Part of the communication time that ran during the backward pass."),
		waitTime:    d("tandem_ddp_wait_seconds_total", "Time steps waited for reductions after the backward pass."),
		overlap:     d("tandem_ddp_overlap_ratio", "Share of the communication time hidden behind the backward pass (overlapped / communication)."),
		reduced:     d("tandem_ddp_buckets_reduced_total", "Gradient buckets handed to the communication hook."),
		overlapped:  d("tandem_ddp_buckets_overlapped_total", "Buckets handed over while the backward pass was still running."),
		bytes:       d("tandem_ddp_bytes_sent_total", "Gradient bytes handed to collectives (after compression)."),
		buckets:     d("tandem_ddp_buckets", "Gradient buckets in the current layout."),
		straggler:   d("tandem_ddp_straggler_factor", "The slowest rank's step time over the median at the last straggler exchange (0 before the first)."),
	}
}

type ddpCollector struct {
	m                                                      StatsSource
	steps, stepTime, computeTime, commTime, overlapTime    *prometheus.Desc
	waitTime, overlap, reduced, overlapped, bytes, buckets *prometheus.Desc
	straggler, forward, backward                           *prometheus.Desc
}

func (c *ddpCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.steps, c.stepTime, c.computeTime, c.commTime, c.overlapTime,
		c.waitTime, c.overlap, c.reduced, c.overlapped, c.bytes, c.buckets, c.straggler, c.forward, c.backward} {
		ch <- d
	}
}

func (c *ddpCollector) Collect(ch chan<- prometheus.Metric) {
	s := c.m.Stats()
	counter := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, v, labels...)
	}
	gauge := func(d *prometheus.Desc, v float64) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v)
	}
	counter(c.steps, float64(s.Steps), "sync")
	counter(c.steps, float64(s.NoSyncSteps), "no_sync")
	counter(c.steps, float64(s.ShadowSteps), "shadow")
	counter(c.stepTime, s.StepTime.Seconds())
	counter(c.computeTime, s.ComputeTime.Seconds())
	counter(c.forward, s.ForwardTime.Seconds())
	counter(c.backward, s.BackwardTime.Seconds())
	counter(c.commTime, s.CommTime.Seconds())
	counter(c.overlapTime, s.OverlappedTime.Seconds())
	counter(c.waitTime, s.WaitTime.Seconds())
	gauge(c.overlap, s.Overlap())
	counter(c.reduced, float64(s.BucketsReduced))
	counter(c.overlapped, float64(s.BucketsOverlapped))
	counter(c.bytes, float64(s.BytesSent))
	gauge(c.buckets, float64(len(s.Buckets)))
	gauge(c.straggler, s.Stragglers.Factor)
}
