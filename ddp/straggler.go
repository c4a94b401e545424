package ddp

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/tandemml/tandem/comm"
	"github.com/tandemml/tandem/launch"
)

// Stragglers: DDP learns every rank's own step time with a comm.StepTimer.
// A rank's own time for a synchronized step is what it spent outside DDP's
// waits since the previous synchronized step returned: the time between
// steps (data loading, the optimizer, the training loop), plus the forward
// and backward passes of this step and of the no-sync steps before it. The
// wait for the buckets' reductions after the backward pass and the
// collectives before the forward pass are left out, since there every rank
// waits for the slowest. Every StragglerEvery synchronized steps (outside
// Join, where ranks take different paths) the ranks exchange their means;
// Stats.Stragglers holds the outcome, and rank 0 logs the slowest rank when
// it is at least comm.DefaultStragglerFactor times the median.

// StragglerEvery sets how many synchronized steps DDP averages between two
// exchanges of the ranks' step times (comm.DefaultStragglerEvery when not
// given): each exchange is one all-gather of one int64 per rank. k < 0
// turns the exchange off. Every rank must pass the same value.
func StragglerEvery(k int) Option {
	return func(c *config) error {
		c.stragglerEvery = k
		return nil
	}
}

// stragglerState is DDP's side of the step timer; guarded by statsState.mu
// where Stats reads it, otherwise used under DDP.mu.
type stragglerState struct {
	timer   *comm.StepTimer
	prevEnd time.Time     // when the last step returned
	own     time.Duration // own time accumulated since the last synchronized step
}

// stragglerStep accounts one step (start: Step was called; runStart: the
// forward pass began; backwardEnd: the backward pass ended) and, for a
// synchronized step outside Join, hands the accumulated own time to the
// step timer, which may exchange it.
func (d *DDP) stragglerStep(ctx context.Context, start, runStart, backwardEnd time.Time, sync bool) error {
	st := &d.stats.strag
	if d.cfg.stragglerEvery < 0 || d.world < 2 {
		return nil
	}
	if !st.prevEnd.IsZero() && start.After(st.prevEnd) {
		st.own += start.Sub(st.prevEnd)
	}
	st.own += backwardEnd.Sub(runStart)
	defer func() { st.prevEnd = time.Now() }()
	if !sync {
		return nil
	}
	own := st.own
	st.own = 0
	if d.joined {
		return nil
	}
	if st.timer == nil {
		t := comm.NewStepTimer(d.pg, comm.StragglerEvery(d.cfg.stragglerEvery))
		d.stats.mu.Lock()
		st.timer = t
		d.stats.mu.Unlock()
	}
	if _, _, err := st.timer.Observe(ctx, own); err != nil {
		return fmt.Errorf("ddp: %w", err)
	}
	return nil
}

// logLayout logs the bucket layout at launch.DebugInfo and above.
func (d *DDP) logLayout(why string) {
	if d.pg.DebugLevel() < launch.DebugInfo || d.rank != 0 {
		return
	}
	bs := d.Buckets()
	sizes := make([]int64, len(bs))
	params := make([]int, len(bs))
	for i, b := range bs {
		sizes[i], params[i] = b.Bytes, len(b.Params)
	}
	d.pg.Logger().LogAttrs(context.Background(), slog.LevelInfo, "ddp: bucket layout", slog.String("why", why),
		slog.String("group", d.pg.Name()), slog.Int("buckets", len(bs)), slog.Any("bytes", sizes), slog.Any("params", params))
}
