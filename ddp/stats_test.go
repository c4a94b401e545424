package ddp_test

import (
	"testing"
	"time"

	"github.com/tandemml/tandem/ddp"
	"github.com/tandemml/tandem/internal/testkit"
)

// Stats splits every step's forward and backward passes at the loss, in
// synchronized and no-sync steps alike: the two add up to ComputeTime, and
// they are the timeline's forward and backward events of the same steps.
func TestStatsForwardBackward(t *testing.T) {
	const world, steps = 2, 4
	pgs := localWorld(t, world)
	ctx := testCtx(t, time.Minute)
	stats := make([]ddp.Stats, world)
	events := make([][]ddp.TraceEvent, world)
	testkit.RequireEachRank(t, world, func(r int) error {
		tl := ddp.NewTimeline(0, 2*steps)
		net, err := ddp.New(ctx, pgs[r], newMLP(t, []int{16, 64, 64, 4}, 1), ddp.WithTimeline(tl))
		if err != nil {
			return err
		}
		x, y := batch(uint64(r), 16, 16, 4)
		for range steps {
			if err := net.NoSync(func() error { _, err := net.Step(ctx, x, y); return err }); err != nil {
				return err
			}
			if _, err := net.Step(ctx, x, y); err != nil {
				return err
			}
		}
		stats[r], events[r] = net.Stats(), tl.Events()
		return nil
	})
	for r, s := range stats {
		if s.Steps != steps || s.NoSyncSteps != steps {
			t.Fatalf("rank %d: %d steps and %d no-sync steps, want %d of each", r, s.Steps, s.NoSyncSteps, steps)
		}
		if s.ForwardTime <= 0 || s.BackwardTime <= 0 || s.ForwardTime+s.BackwardTime != s.ComputeTime || s.ComputeTime > s.StepTime {
			t.Errorf("rank %d: forward %v + backward %v, compute %v, step %v: want both positive, adding up to compute, within the step",
				r, s.ForwardTime, s.BackwardTime, s.ComputeTime, s.StepTime)
		}
		var fwd, bwd time.Duration
		var nf, nb int
		for _, e := range events[r] {
			switch e.Name {
			case ddp.EventForward:
				fwd += time.Duration(e.Dur) * time.Microsecond
				nf++
			case ddp.EventBackward:
				bwd += time.Duration(e.Dur) * time.Microsecond
				nb++
			}
		}
		if nf != 2*steps || nb != 2*steps {
			t.Fatalf("rank %d: the timeline has %d forward and %d backward events, want %d of each", r, nf, nb, 2*steps)
		}
		// The timeline rounds each event to microseconds.
		slack := time.Duration(2*steps) * time.Microsecond
		if d := (s.ForwardTime - fwd).Abs(); d > slack {
			t.Errorf("rank %d: forward time %v, the timeline's forward events %v", r, s.ForwardTime, fwd)
		}
		if d := (s.BackwardTime - bwd).Abs(); d > slack {
			t.Errorf("rank %d: backward time %v, the timeline's backward events %v", r, s.BackwardTime, bwd)
		}
		t.Logf("rank %d: %v", r, s)
	}
}
