package ddp

import (
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/tandemml/tandem/comm"
)

// Stats are counters of a DDP's work since New, for printing and for
// benchmarks. Times are wall-clock durations summed over steps.
type Stats struct {
	// Steps counts synchronized steps, NoSyncSteps steps inside NoSync, and
	// ShadowSteps the steps this rank shadowed after joining (see Join).
	Steps, NoSyncSteps, ShadowSteps int64
	// Buckets is the current bucket layout; Rebuilt tells whether it has
	// been rebuilt in the order gradients became ready.
	Buckets []BucketInfo
	Rebuilt bool
	// BucketsReduced counts buckets handed to the comm hook;
	// BucketsOverlapped those among them handed over while the backward
	// pass was still computing gradients: a direct sign of overlap.
	BucketsReduced, BucketsOverlapped int64
	// BytesSent is the gradient payload this rank handed to collectives
	// (after compression, for hooks that compress): a ring all-reduce puts
	// about 2(n-1)/n times this on the wire.
	BytesSent int64
	// GradsInBucket counts the gradients, one per parameter and
	// synchronized step, that the backward pass computed straight into
	// their bucket views; GradsCopied those copied into the views from a
	// buffer of their own (a no-sync step before, or an op that cannot
	// write into a given tensor).
	GradsInBucket, GradsCopied int64
	// StepTime is the time spent in Step, ComputeTime its forward and
	// backward passes: ForwardTime up to the loss and BackwardTime from the
	// loss on. ComputeTime is their sum, except that a GraphDDP run under
	// TapeMachine (or driven by the loop outside Pass.Run with an executor
	// of its own), which does not say when the loss was ready, counts in
	// ComputeTime alone.
	StepTime, ComputeTime     time.Duration
	ForwardTime, BackwardTime time.Duration
	// CommTime is the time during which at least one bucket's reduction was
	// in flight (from its hand-over to the hook until its result was
	// ready); OverlappedTime the part of it during the backward pass, and
	// WaitTime the time Step waited for reductions after the backward pass.
	CommTime, OverlappedTime, WaitTime time.Duration
	// Stragglers is what the last exchange of the ranks' own step times
	// found (see StragglerEvery): every rank's mean time outside DDP's
	// waits, the slowest rank and its factor over the median. Zero until
	// the first exchange.
	Stragglers comm.StepTimes
}

// Overlap returns the share of communication time that was hidden behind
// the backward pass (OverlappedTime / CommTime), 0 when nothing was sent.
func (s Stats) Overlap() float64 {
	if s.CommTime <= 0 {
		return 0
	}
	return float64(s.OverlappedTime) / float64(s.CommTime)
}

// String formats the statistics over a few lines.
func (s Stats) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "steps %d (no-sync %d, shadowed %d); %d buckets", s.Steps, s.NoSyncSteps, s.ShadowSteps, len(s.Buckets))
	if s.Rebuilt {
		b.WriteString(" (rebuilt in ready order)")
	}
	b.WriteString(":")
	for _, bk := range s.Buckets {
		fmt.Fprintf(&b, " %s", byteSize(bk.Bytes))
	}
	fmt.Fprintf(&b, "\nsent %s in %d bucket reductions, %d started during backward; gradients computed in the buckets %d, copied in %d", byteSize(s.BytesSent), s.BucketsReduced, s.BucketsOverlapped, s.GradsInBucket, s.GradsCopied)
	fmt.Fprintf(&b, "\nstep %v, compute %v (forward %v, backward %v), communication %v (%.0f%% overlapped with backward), waiting %v",
		s.StepTime.Round(time.Microsecond), s.ComputeTime.Round(time.Microsecond), s.ForwardTime.Round(time.Microsecond),
		s.BackwardTime.Round(time.Microsecond), s.CommTime.Round(time.Microsecond),
		100*s.Overlap(), s.WaitTime.Round(time.Microsecond))
	if len(s.Stragglers.Times) > 0 {
		fmt.Fprintf(&b, "\n%s", s.Stragglers)
	}
	return b.String()
}

func byteSize(n int64) string {
	switch {
	case n >= 1<<30:
		return fmt.Sprintf("%.2f GiB", float64(n)/(1<<30))
	case n >= 1<<20:
		return fmt.Sprintf("%.2f MiB", float64(n)/(1<<20))
	case n >= 1<<10:
		return fmt.Sprintf("%.2f KiB", float64(n)/(1<<10))
	}
	return fmt.Sprintf("%d B", n)
}

// statsState accumulates Stats.
type statsState struct {
	mu    sync.Mutex
	s     Stats
	strag stragglerState
}

// Stats returns the counters so far and the current bucket layout.
func (d *DDP) Stats() Stats {
	d.stats.mu.Lock()
	s := d.stats.s
	timer := d.stats.strag.timer
	d.stats.mu.Unlock()
	if timer != nil {
		s.Stragglers = timer.Last()
	}
	s.Buckets = d.Buckets()
	d.layoutMu.Lock()
	s.Rebuilt = d.rebuiltFlag
	d.layoutMu.Unlock()
	return s
}

// ResetStats zeroes the counters (the layout is kept), for example after
// warm-up steps.
func (d *DDP) ResetStats() {
	d.stats.mu.Lock()
	d.stats.s = Stats{}
	d.stats.mu.Unlock()
}

func (st *statsState) noSyncStep(s *stepState, runStart time.Time, total time.Duration) {
	st.mu.Lock()
	defer st.mu.Unlock()
	st.s.NoSyncSteps++
	st.addCompute(s, runStart)
	st.s.StepTime += total
}

// addCompute adds a run's forward and backward passes; st.mu is held.
func (st *statsState) addCompute(s *stepState, runStart time.Time) {
	st.s.ComputeTime += s.backwardEnd.Sub(runStart)
	if f := s.forwardEnd; !f.IsZero() && !f.Before(runStart) && !f.After(s.backwardEnd) {
		st.s.ForwardTime += f.Sub(runStart)
		st.s.BackwardTime += s.backwardEnd.Sub(f)
	}
}

// syncStep adds a synchronized (or shadowed) step.
func (st *statsState) syncStep(s *stepState, runStart, start time.Time) {
	end := time.Now()
	comm, overlapped := commIntervals(s.launchAt, s.doneAt, s.backwardEnd)
	st.mu.Lock()
	defer st.mu.Unlock()
	if s.shadow {
		st.s.ShadowSteps++
	} else {
		st.s.Steps++
		st.addCompute(s, runStart)
	}
	st.s.StepTime += end.Sub(start)
	st.s.WaitTime += end.Sub(s.backwardEnd)
	st.s.BucketsReduced += int64(len(s.futures))
	st.s.BucketsOverlapped += int64(s.overlapped)
	st.s.BytesSent += s.sent
	st.s.GradsInBucket += s.inBucket
	st.s.GradsCopied += s.copied
	st.s.CommTime += comm
	st.s.OverlappedTime += overlapped
}

// commIntervals returns the length of the union of the intervals
// [launch[i], done[i]] and the part of it before cut.
func commIntervals(launch, done []time.Time, cut time.Time) (total, before time.Duration) {
	type iv struct{ a, b time.Time }
	var ivs []iv
	for i := range launch {
		if launch[i].IsZero() || done[i].IsZero() || done[i].Before(launch[i]) {
			continue
		}
		ivs = append(ivs, iv{launch[i], done[i]})
	}
	slices.SortFunc(ivs, func(x, y iv) int { return x.a.Compare(y.a) })
	var cur *iv
	flush := func() {
		if cur == nil {
			return
		}
		total += cur.b.Sub(cur.a)
		if cur.a.Before(cut) {
			end := cur.b
			if cut.Before(end) {
				end = cut
			}
			before += end.Sub(cur.a)
		}
	}
	for i := range ivs {
		if cur != nil && !ivs[i].a.After(cur.b) {
			if ivs[i].b.After(cur.b) {
				cur.b = ivs[i].b
			}
			continue
		}
		flush()
		c := ivs[i]
		cur = &c
	}
	flush()
	return total, before
}
