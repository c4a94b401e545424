package comm

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	"gorgonia.org/tensor"

	"github.com/tandemml/tandem/internal/admit"
)

// Stragglers.
//
// In a synchronous job every rank waits for the slowest at every
// collective, so the wall time of a step is the same everywhere and says
// nothing about who is slow. What differs is each rank's own time: the part
// of the step it spends computing (loading data, forward and backward
// passes) rather than waiting for its peers. A StepTimer collects that
// time on each rank and, every few steps, all-gathers its mean over the
// window (one int64 per rank, a tiny collective), so that every rank knows
// every rank's pace, the slowest rank, and by what factor it is slower than
// the median.

// Defaults of a StepTimer.
const (
	// DefaultStragglerEvery is how many steps a StepTimer averages before
	// it exchanges them.
	DefaultStragglerEvery = 20
	// DefaultStragglerFactor is the factor over the median from which the
	// slowest rank is reported in the log.
	DefaultStragglerFactor = 1.5
	// DefaultStragglerLogEvery is the least time between two log lines
	// about stragglers.
	DefaultStragglerLogEvery = time.Minute
)

// StepTimes is what a StepTimer learned at its last exchange.
type StepTimes struct {
	// Step is the number of steps observed when the exchange took place,
	// Window the number of steps each rank's time is the mean of.
	Step   int64
	Window int
	// Times holds each rank's mean own step time (the time it did not
	// spend waiting for its peers), by group rank.
	Times []time.Duration
	// Median is the median of Times; Slowest the rank with the longest
	// time, and Factor its time over the median (1 when all are equal).
	Median  time.Duration
	Slowest int
	Factor  float64
}

// String says who is slowest and by how much, then every rank's time.
func (s StepTimes) String() string {
	if len(s.Times) == 0 {
		return "no step times exchanged yet"
	}
	var b strings.Builder
	fmt.Fprintf(&b, "slowest rank %d: %.2fx the median step time (%v vs %v, mean of %d steps up to step %d); ranks:",
		s.Slowest, s.Factor, s.Times[s.Slowest].Round(time.Microsecond), s.Median.Round(time.Microsecond), s.Window, s.Step)
	for r, t := range s.Times {
		fmt.Fprintf(&b, " %d=%v", r, t.Round(time.Microsecond))
	}
	return b.String()
}

// StepTimer learns every rank's step time. Each rank of the group creates
// one and calls Observe once per step with the time that rank spent on the
// step's own work; every Every steps, Observe exchanges the means over the
// window with one small all-gather, so every rank must call it the same
// number of times (as with any collective). DDP keeps one (see ddp.Stats);
// other loops call it themselves. Its methods may be called from one
// goroutine at a time, except Last, which any goroutine may call.
type StepTimer struct {
	pg      *ProcessGroup
	every   int
	factor  float64
	warn    *admit.Warner
	n       int64
	sum     time.Duration
	cnt     int
	in, out *tensor.Dense
	mu      sync.Mutex
	last    StepTimes
}

// StepTimerOption configures NewStepTimer.
type StepTimerOption func(*StepTimer)

// StragglerEvery sets how many steps are averaged between exchanges
// (DefaultStragglerEvery); k < 1 keeps the default.
func StragglerEvery(k int) StepTimerOption {
	return func(s *StepTimer) {
		if k >= 1 {
			s.every = k
		}
	}
}

// StragglerFactor sets the factor over the median from which the slowest
// rank is logged (DefaultStragglerFactor); f <= 1 keeps the default.
func StragglerFactor(f float64) StepTimerOption {
	return func(s *StepTimer) {
		if f > 1 {
			s.factor = f
		}
	}
}

// StragglerLog sets where stragglers are reported and how often at most
// (by default the group's logger when WithLogger gave one, else
// slog.Default(), at most once per DefaultStragglerLogEvery). Only the
// group's rank 0 logs.
func StragglerLog(l *slog.Logger, every time.Duration) StepTimerOption {
	return func(s *StepTimer) { s.warn = admit.NewWarner(l, every) }
}

// NewStepTimer returns a StepTimer over pg.
func NewStepTimer(pg *ProcessGroup, opts ...StepTimerOption) *StepTimer {
	s := &StepTimer{pg: pg, every: DefaultStragglerEvery, factor: DefaultStragglerFactor}
	for _, o := range opts {
		o(s)
	}
	if s.warn == nil {
		l := slog.Default()
		if pg.opts.loggerSet {
			l = pg.opts.logger
		}
		s.warn = admit.NewWarner(l, DefaultStragglerLogEvery)
	}
	s.in = tensor.New(tensor.Of(tensor.Int64), tensor.WithShape(1))
	s.out = tensor.New(tensor.Of(tensor.Int64), tensor.WithShape(pg.Size()))
	return s
}

// Observe adds one step that took d of this rank's own time. On every
// Every-th call it exchanges the window's means with the other ranks, logs
// the slowest rank when it is at least the straggler factor over the
// median, and returns what it learned with exchanged true.
func (s *StepTimer) Observe(ctx context.Context, d time.Duration) (times StepTimes, exchanged bool, err error) {
	s.n++
	s.sum += d
	s.cnt++
	if s.cnt < s.every {
		return StepTimes{}, false, nil
	}
	mean := s.sum / time.Duration(s.cnt)
	window := s.cnt
	s.sum, s.cnt = 0, 0
	s.in.Int64s()[0] = int64(mean)
	if err := s.pg.AllGatherIntoTensor(ctx, s.out, s.in).Wait(ctx); err != nil {
		return StepTimes{}, false, fmt.Errorf("comm: exchanging step times: %w", err)
	}
	all := s.out.Int64s()
	st := StepTimes{Step: s.n, Window: window, Times: make([]time.Duration, len(all))}
	for r, v := range all {
		st.Times[r] = time.Duration(v)
		if st.Times[r] > st.Times[st.Slowest] {
			st.Slowest = r
		}
	}
	st.Median = median(st.Times)
	st.Factor = 1
	if st.Median > 0 {
		st.Factor = float64(st.Times[st.Slowest]) / float64(st.Median)
	}
	s.mu.Lock()
	s.last = st
	s.mu.Unlock()
	if st.Factor >= s.factor && s.pg.Rank() == 0 {
		s.warn.Warn("comm: straggler: rank "+fmt.Sprint(st.Slowest)+" is slowest", "group", s.pg.Name(),
			"rank", st.Slowest, "factor", fmt.Sprintf("%.2f", st.Factor), "its_step", st.Times[st.Slowest],
			"median_step", st.Median, "step", st.Step, "times", st.Times)
	}
	return st, true, nil
}

// Last returns what the last exchange learned (zero before the first).
func (s *StepTimer) Last() StepTimes {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := s.last
	st.Times = slices.Clone(st.Times)
	return st
}

// median of ds (the mean of the middle two for an even count).
func median(ds []time.Duration) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	n := len(s)
	if n == 0 {
		return 0
	}
	if n%2 == 1 {
		return s[n/2]
	}
	return (s[n/2-1] + s[n/2]) / 2
}
