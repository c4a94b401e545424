package ddp

import (
	"context"
	"fmt"
	"time"

	"gorgonia.org/tensor"

	"github.com/tandemml/tandem/comm"
	"github.com/tandemml/tandem/graph"
)

// plan is what one step communicates, decided alike on every rank: by each
// rank alone outside Join, and from the exchanged join flags inside it.
type plan struct {
	sync       bool // reduce gradients (false in NoSync)
	rebuild    bool // rebuild the buckets from rank 0's ready order first
	usedMap    bool // all-reduce the map of used parameters
	buffers    bool // broadcast the buffers
	bufferRoot int  // from this rank
}

// localPlan is the plan of an active rank.
func (d *DDP) localPlan() plan {
	p := plan{sync: d.noSync == 0}
	p.rebuild = p.sync && d.rebuildPending
	p.usedMap = p.sync && (d.cfg.findUnused || d.cfg.staticGraph) && !(d.cfg.staticGraph && d.staticUsed != nil)
	p.buffers = d.cfg.syncBuffers && len(d.buffers) > 0
	return p
}

// Step runs one training step on this rank's batch: forward pass of the model
// on x, the loss against the target y (WithLoss; by default cross entropy
// with int64 class indices), and the backward pass, during which full
// buckets of gradients are all-reduced while the rest of the backward pass
// goes on. It returns this rank's loss once every bucket is reduced, leaving
// in each parameter's Grad the gradient averaged over the ranks (for the
// default reduction: each rank's gradient times 1/world, summed, as PyTorch
// computes it). Call the optimizer's Step next; there is no need to zero the
// gradients in between, since every synchronized step overwrites them.
//
// Inside NoSync, Step only accumulates this rank's gradients into Grad; the
// next Step outside NoSync adds its own gradient and reduces the sum.
//
// Every rank must call Step the same number of times, in the same NoSync
// state (use Join when the ranks have different numbers of batches). A Step
// that fails (a lost peer, a timeout, a bad input) leaves the ranks out of
// step: DDP aborts the process group, so the other ranks fail promptly with
// comm.ErrPeerLost rather than hang, and refuses further steps.
//
// The first Step for each new input shape builds and compiles the graph; x
// and y are bound to it as they are (not copied) for the step.
func (d *DDP) Step(ctx context.Context, x, y *tensor.Dense) (float64, error) {
	if ctx == nil {
		return 0, fmt.Errorf("ddp: Step: nil context: %w", ErrInvalidArgument)
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if err := d.usable(); err != nil {
		return 0, err
	}
	loss, err := d.step(ctx, x, y)
	if err != nil {
		d.fail(err)
		return 0, err
	}
	return loss, nil
}

func (d *DDP) step(ctx context.Context, x, y *tensor.Dense) (float64, error) {
	start := time.Now()
	if x != nil && x.IsScalar() || y != nil && y.IsScalar() {
		return 0, fmt.Errorf("ddp: Step needs batched tensors, got a scalar input or target: %w", ErrInvalidArgument)
	}
	prog, err := d.program(x, y)
	if err != nil {
		return 0, err
	}
	pl := d.localPlan()
	if d.joined && prog.syncBN {
		return 0, fmt.Errorf("ddp: a model with SyncBatchNorm cannot train inside Join: a rank that has joined runs no forward pass to take part in its collectives: %w", ErrInvalidArgument)
	}
	if d.joined {
		flags, err := d.exchangeFlags(ctx, pl, true)
		if err != nil {
			return 0, err
		}
		if _, err := d.agreePlan(flags, &pl); err != nil {
			return 0, err
		}
	}
	if err := d.prepare(ctx, pl); err != nil {
		return 0, err
	}
	if !pl.sync && !d.accumulated {
		for _, b := range d.buckets {
			zeroDense(b.buf)
		}
	}
	s := d.newStepState(ctx, pl, prog)
	d.aimGrads(prog, s)
	d.cur = s
	defer func() { d.cur = nil }()
	if pl.sync {
		if err := s.begin(); err != nil {
			return 0, err
		}
	}
	runStart := time.Now()
	err = prog.prog.Run(ctx, graph.Bind(prog.x, x), graph.Bind(prog.y, y))
	s.backwardEnd = time.Now()
	if err != nil {
		s.abandon()
		return 0, fmt.Errorf("ddp: forward and backward pass: %w", err)
	}
	loss, err := lossValue(prog.prog.Value(prog.loss))
	if err != nil {
		s.abandon()
		return 0, err
	}
	if !pl.sync {
		for pi, u := range prog.used {
			if u {
				d.params[pi].Grad = d.view(pi)
				d.hasGrad[pi] = true
			}
		}
		d.accumulated = true
		d.stats.noSyncStep(s, runStart, time.Since(start))
		if tl := d.cfg.timeline; tl != nil {
			tl.record(d.rank, s, start, runStart, time.Now())
		}
		return loss, d.stragglerStep(ctx, start, runStart, s.backwardEnd, false)
	}
	if err := s.finish(); err != nil {
		return 0, err
	}
	d.afterSync(s, pl)
	d.stats.syncStep(s, runStart, start)
	if tl := d.cfg.timeline; tl != nil {
		tl.record(d.rank, s, start, runStart, time.Now())
	}
	return loss, d.stragglerStep(ctx, start, runStart, s.backwardEnd, true)
}

// prepare does a step's collectives that come before the forward pass:
// the bucket rebuild and the buffer broadcast.
func (d *DDP) prepare(ctx context.Context, pl plan) error {
	if pl.rebuild {
		if err := d.rebuildBuckets(ctx); err != nil {
			return err
		}
		d.logLayout("rebuilt in the order gradients became ready")
	}
	if pl.buffers {
		ts := make([]*tensor.Dense, len(d.buffers))
		for i, b := range d.buffers {
			ts[i] = b.Value
		}
		if err := broadcastTensors(ctx, d.pg, ts, pl.bufferRoot); err != nil {
			return fmt.Errorf("ddp: broadcasting buffers from rank %d: %w", pl.bufferRoot, err)
		}
	}
	return nil
}

// afterSync updates the reducer's state after a synchronized step (real or
// shadowed).
func (d *DDP) afterSync(s *stepState, pl plan) {
	if pl.rebuild {
		d.rebuildPending, d.rebuilt = false, true
		d.layoutMu.Lock()
		d.rebuiltFlag = true
		d.layoutMu.Unlock()
	}
	if !d.rebuilt && !d.rebuildPending {
		d.readyOrder = s.order
		d.rebuildPending = true
	}
	if pl.usedMap && d.cfg.staticGraph {
		d.staticUsed = s.globalUsed
	}
	d.accumulated = false
}

// rebuildBuckets lays the buckets out again in the order rank 0's gradients
// became ready in its first synchronized step, so the first bucket fills
// first. Rank 0's order is broadcast so every rank builds the same buckets.
func (d *DDP) rebuildBuckets(ctx context.Context) error {
	order := tensor.New(tensor.Of(tensor.Int64), tensor.WithShape(len(d.params)))
	if d.rank == 0 {
		o := d.completeOrder(d.readyOrder)
		for i, pi := range o {
			order.Int64s()[i] = int64(pi)
		}
	}
	if d.world > 1 {
		if err := d.pg.Broadcast(ctx, order, 0).Wait(ctx); err != nil {
			return fmt.Errorf("ddp: broadcasting the bucket order: %w", err)
		}
	}
	o := make([]int, len(d.params))
	seen := make([]bool, len(d.params))
	for i, v := range order.Int64s() {
		if v < 0 || int(v) >= len(d.params) || seen[v] {
			return fmt.Errorf("ddp: rank 0 sent a malformed bucket order: %w", ErrMismatch)
		}
		seen[v] = true
		o[i] = int(v)
	}
	return d.setLayout(ctx, o)
}

// completeOrder returns ready (the order gradients became ready) extended by
// the parameters it lacks, in the current bucket order.
func (d *DDP) completeOrder(ready []int) []int {
	out := make([]int, 0, len(d.params))
	seen := make([]bool, len(d.params))
	for _, pi := range ready {
		if pi >= 0 && pi < len(d.params) && !seen[pi] {
			seen[pi] = true
			out = append(out, pi)
		}
	}
	for _, b := range d.buckets {
		for _, pi := range b.params {
			if !seen[pi] {
				seen[pi] = true
				out = append(out, pi)
			}
		}
	}
	return out
}

// view returns parameter pi's gradient view in its bucket.
func (d *DDP) view(pi int) *tensor.Dense {
	return d.buckets[d.bucketOf[pi]].views[d.slotOf[pi]]
}

// usedMapWork starts the all-reduce of the used-parameter map: used[i] is 1
// where this rank used parameter i.
func (d *DDP) usedMapWork(ctx context.Context, used []bool) (*tensor.Dense, comm.Work) {
	m := tensor.New(tensor.Of(tensor.Int32), tensor.WithShape(len(d.params)))
	for i, u := range used {
		if u {
			m.Int32s()[i] = 1
		}
	}
	return m, d.pg.AllReduce(ctx, m, comm.Sum)
}

func boolsOf(m *tensor.Dense) []bool {
	out := make([]bool, m.Shape().TotalSize())
	for i, v := range m.Int32s() {
		out[i] = v != 0
	}
	return out
}
