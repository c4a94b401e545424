package ddp

import (
	"context"
	"fmt"
	"slices"
	"time"

	"gorgonia.org/tensor"

	"github.com/tandemml/tandem/comm"
)

// NoSync runs fn with gradient synchronization off (PyTorch's no_sync
// context): Steps inside fn compute this rank's gradients and add them into
// Grad without communicating, and the first Step after NoSync returns adds
// its own gradient and reduces the accumulated sum. Accumulating k batches
// this way gives the gradients of one k times larger batch (with a mean loss,
// k times the mean over it) at the cost of a single reduction. Every rank
// must enter NoSync for the same steps. NoSync may nest.
func (d *DDP) NoSync(fn func() error) error {
	if fn == nil {
		return fmt.Errorf("ddp: NoSync(nil): %w", ErrInvalidArgument)
	}
	d.mu.Lock()
	d.noSync++
	d.mu.Unlock()
	defer func() {
		d.mu.Lock()
		d.noSync--
		d.mu.Unlock()
	}()
	return fn()
}

// Join runs fn, this rank's training loop, in a mode that tolerates uneven
// inputs (PyTorch's Join context manager with DDP): ranks may run different
// numbers of Steps inside fn. Every rank calls Join. Inside it, each Step
// first all-reduces a small vector of flags saying which ranks still have
// work (and whether the step synchronizes); once fn has returned on a rank,
// that rank has joined: it keeps answering those flags and shadows every
// step of the ranks still training, taking part in their buffer broadcast
// and in each bucket's reduction with a bucket of zeros (through the comm
// hook), so nobody waits for a rank that has run out of data. The divisor
// of the average stays the full world size, as PyTorch's default
// (divide_by_initial_world_size). When every rank has joined, the
// parameters and buffers of the last rank to join (the lowest such rank) are
// broadcast to all, since joined ranks stopped applying updates; optimizer
// state is not synchronized.
//
// If fn fails on one rank, that rank aborts the process group so the others
// fail promptly too. Join returns fn's error, or the first error of the
// shadowing.
func (d *DDP) Join(ctx context.Context, fn func() error) error {
	if ctx == nil || fn == nil {
		return fmt.Errorf("ddp: Join needs a context and a function: %w", ErrInvalidArgument)
	}
	d.mu.Lock()
	if err := d.usable(); err != nil {
		d.mu.Unlock()
		return err
	}
	if d.joined {
		d.mu.Unlock()
		return fmt.Errorf("ddp: Join called inside Join: %w", ErrInvalidArgument)
	}
	d.joined, d.lastRoot = true, -1
	d.mu.Unlock()

	ferr := fn()

	d.mu.Lock()
	defer d.mu.Unlock()
	d.joined = false
	if ferr != nil {
		d.fail(fmt.Errorf("the training loop given to Join failed: %w", ferr))
		return ferr
	}
	if err := d.usable(); err != nil {
		return err
	}
	if err := d.shadowUntilAllJoined(ctx); err != nil {
		d.fail(err)
		return err
	}
	return nil
}

func (d *DDP) shadowUntilAllJoined(ctx context.Context) error {
	defer d.keepSharedGrads()()
	for {
		start := time.Now()
		var pl plan
		flags, err := d.exchangeFlags(ctx, pl, false)
		if err != nil {
			return err
		}
		active, err := d.agreePlan(flags, &pl)
		if err != nil {
			return err
		}
		if active == 0 {
			break
		}
		if err := d.shadowStep(ctx, pl, start); err != nil {
			return err
		}
	}
	if d.lastRoot < 0 || d.world == 1 {
		return nil
	}
	state := make([]*tensor.Dense, 0, len(d.allParams)+len(d.buffers))
	for _, p := range d.allParams {
		state = append(state, p.Value)
	}
	for _, b := range d.buffers {
		state = append(state, b.Value)
	}
	if err := broadcastTensors(ctx, d.pg, state, d.lastRoot); err != nil {
		return fmt.Errorf("ddp: Join: broadcasting the final model from rank %d, the last to join: %w", d.lastRoot, err)
	}
	return nil
}

// exchangeFlags all-reduces the join flags: one entry per rank (1 while it
// has work), then the number of active ranks that synchronize this step,
// that rebuild the buckets, and that all-reduce the used map.
func (d *DDP) exchangeFlags(ctx context.Context, pl plan, active bool) ([]int64, error) {
	w := d.world
	f := tensor.New(tensor.Of(tensor.Int64), tensor.WithShape(w+3))
	v := f.Int64s()
	if active {
		v[d.rank] = 1
		v[w] = b2i(pl.sync)
		v[w+1] = b2i(pl.rebuild)
		v[w+2] = b2i(pl.usedMap)
	}
	if w > 1 {
		if err := d.pg.AllReduce(ctx, f, comm.Sum).Wait(ctx); err != nil {
			return nil, fmt.Errorf("ddp: exchanging join flags: %w", err)
		}
	}
	return v, nil
}

func b2i(b bool) int64 {
	if b {
		return 1
	}
	return 0
}

// agreePlan turns the summed join flags into the step's plan, the same on
// every rank, and returns the number of active ranks.
func (d *DDP) agreePlan(v []int64, pl *plan) (int, error) {
	w := d.world
	active, root := 0, -1
	for r := 0; r < w; r++ {
		if v[r] != 0 {
			active++
			if root < 0 {
				root = r
			}
		}
	}
	if active == 0 {
		return 0, nil
	}
	d.lastRoot = root
	check := func(what string, x int64) (bool, error) {
		switch x {
		case 0:
			return false, nil
		case int64(active):
			return true, nil
		}
		return false, fmt.Errorf("ddp: the ranks disagree on %s: %d of the %d ranks still training do: %w", what, x, active, ErrMismatch)
	}
	var err error
	if pl.sync, err = check("synchronizing this step (NoSync)", v[w]); err != nil {
		return 0, err
	}
	if pl.rebuild, err = check("rebuilding the buckets now", v[w+1]); err != nil {
		return 0, err
	}
	if pl.usedMap, err = check("exchanging the used-parameter map now", v[w+2]); err != nil {
		return 0, err
	}
	pl.buffers = d.cfg.syncBuffers && len(d.buffers) > 0
	pl.bufferRoot = root
	return active, nil
}

// shadowStep takes a joined rank through the collectives of one step of the
// ranks still training, with zero gradients.
func (d *DDP) shadowStep(ctx context.Context, pl plan, start time.Time) error {
	if err := d.prepare(ctx, pl); err != nil {
		return err
	}
	if !pl.sync {
		d.stats.mu.Lock()
		d.stats.s.ShadowSteps++
		d.stats.mu.Unlock()
		return nil
	}
	s := d.newStepState(ctx, pl, nil)
	s.shadow = true
	s.buckets = d.shadowBuckets()
	if pl.usedMap {
		s.usedMap, s.usedWork = d.usedMapWork(ctx, make([]bool, len(d.params)))
	}
	s.backwardEnd = time.Now()
	s.mu.Lock()
	for bi, b := range s.buckets {
		zeroDense(b.buf)
		s.pending[bi] = 0
		s.launch(bi)
	}
	s.next = len(s.buckets)
	s.mu.Unlock()
	if err := s.finish(); err != nil {
		return err
	}
	d.afterSync(s, pl)
	d.stats.syncStep(s, s.backwardEnd, start)
	return nil
}

// keepSharedGrads copies aside what the buckets in shared memory
// (SharedBuckets) hold, the rank's last gradients: a joined rank shadows
// those buckets in that memory, where the others all-reduce theirs in
// place. The function it returns puts the gradients back into the buckets
// that are still laid out as they were, so that, as in PyTorch, shadowing
// leaves a joined rank's gradients as its last step made them.
func (d *DDP) keepSharedGrads() (restore func()) {
	type kept struct {
		b          *bucket
		buf, saved *tensor.Dense
	}
	var ks []kept
	d.layoutMu.Lock()
	for _, b := range d.buckets {
		if b.shared != nil {
			ks = append(ks, kept{b, b.buf, b.buf.Clone().(*tensor.Dense)})
		}
	}
	d.layoutMu.Unlock()
	return func() {
		d.layoutMu.Lock()
		defer d.layoutMu.Unlock()
		for _, k := range ks {
			if k.b.buf == k.buf && slices.Contains(d.buckets, k.b) {
				copy(k.buf.Header.Raw, k.saved.Header.Raw)
			}
		}
	}
}

// shadowBuckets returns buckets laid out like the real ones, for a joined
// rank's zero gradients: over buffers of their own, or, for a bucket in
// shared memory, over that memory (keepSharedGrads keeps its contents), so
// that the joined rank's all-reduce is the same in-place collective as the
// others'.
func (d *DDP) shadowBuckets() []*bucket {
	if d.shadow != nil {
		out := make([]*bucket, len(d.shadow))
		for i, gb := range d.shadow {
			out[i] = gb.bucket
		}
		return out
	}
	out := make([]*bucket, len(d.buckets))
	d.shadow = make([]*GradBucket, len(d.buckets))
	for i, b := range d.buckets {
		sb := &bucket{index: b.index, dtype: b.dtype, params: b.params, offsets: b.offsets, numel: b.numel}
		if b.shared != nil {
			sb.buf, sb.views = b.buf, b.views
		} else {
			sb.buf = tensor.New(tensor.Of(b.dtype), tensor.WithShape(b.numel))
			sb.views = make([]*tensor.Dense, len(b.params))
			for k, pi := range b.params {
				sb.views[k] = viewOf(sb.buf, b.offsets[k], d.params[pi].Value.Shape())
			}
		}
		sb.gb = &GradBucket{index: i, last: i == len(d.buckets)-1, buf: sb.buf, grads: sb.views, offsets: b.offsets, params: b.gb.params, d: d, shadow: true, bucket: sb}
		out[i], d.shadow[i] = sb, sb.gb
	}
	return out
}
