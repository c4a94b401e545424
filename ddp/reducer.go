package ddp

import (
	"context"
	"fmt"
	"sync"
	"time"

	G "gorgonia.org/gorgonia"
	"gorgonia.org/tensor"

	"github.com/tandemml/tandem/comm"
)

// stepState is the reducer's state during one step: which buckets still
// wait for gradients, which have been handed to the comm hook, and their
// futures.
type stepState struct {
	d      *DDP
	ctx    context.Context
	pl     plan
	prog   *program // nil when shadowing
	shadow bool

	scale bool // default reduction: multiply by 1/world while copying
	accum bool // add into what the views hold
	inv64 float64
	inv32 float32

	mu         sync.Mutex
	buckets    []*bucket
	pending    []int
	next       int
	left       int // used gradients not yet ready
	overlapped int // buckets launched while gradients were still pending
	futures    []Future
	launchAt   []time.Time
	doneAt     []time.Time
	recording  bool
	order      []int
	err        error

	usedMap    *tensor.Dense
	usedWork   comm.Work
	globalUsed []bool

	inBucket, copied int64 // gradients computed in their views, copied in

	backwardEnd time.Time
	forwardEnd  time.Time // the loss was computed (zero when the executor could not say: TapeMachine)
	// afterBackward: the gradients are marked ready after the pass that
	// computed them (TapeMachine, a graph the user ran), so no bucket
	// overlaps with it.
	afterBackward bool
	stop          chan struct{}
	watchers      sync.WaitGroup
	sent          int64
}

func (d *DDP) newStepState(ctx context.Context, pl plan, prog *program) *stepState {
	s := &stepState{d: d, ctx: ctx, pl: pl, prog: prog, buckets: d.buckets}
	s.scale = d.cfg.hook == nil
	s.inv64 = 1 / float64(d.world)
	s.inv32 = float32(s.inv64)
	s.accum = d.accumulated
	if !pl.sync {
		return s
	}
	n := len(s.buckets)
	s.pending = make([]int, n)
	for i, b := range s.buckets {
		s.pending[i] = len(b.params)
	}
	s.futures = make([]Future, n)
	s.launchAt = make([]time.Time, n)
	s.doneAt = make([]time.Time, n)
	s.stop = make(chan struct{})
	s.recording = !d.rebuilt && !d.rebuildPending
	return s
}

// begin starts a synchronized step: the all-reduce of the used map, and the
// parameters this step's graph does not use are marked ready (their
// gradient zero, or what no-sync steps accumulated), which may already send
// buckets that hold nothing else.
func (s *stepState) begin() error {
	d := s.d
	if !s.accum && s.prog != nil && len(s.prog.unused) > 0 {
		for _, pi := range s.prog.unused {
			zeroDense(d.view(pi))
		}
	}
	if s.pl.usedMap {
		s.usedMap, s.usedWork = d.usedMapWork(s.ctx, s.prog.used)
	}
	s.left = s.prog.grads
	for _, pi := range s.prog.unused {
		if s.accum && s.scale {
			scaleDense(d.view(pi), s.inv64, s.inv32)
		}
		if err := s.markReady(pi); err != nil {
			return err
		}
	}
	return nil
}

// gradReady is the graph hook: the gradient of parameter pi is final.
func (s *stepState) gradReady(pi int, v G.Value) error {
	if s == nil {
		return fmt.Errorf("ddp: gradient hook fired outside a step: %w", ErrInvalidArgument)
	}
	d := s.d
	if !s.pl.sync {
		return addGrad(d.view(pi), v, true, false, 0, 0)
	}
	inPlace := !s.accum && sameMemory(v, d.view(pi)) // computed there, scaled (aimGrads)
	if !inPlace {
		if err := addGrad(d.view(pi), v, s.accum, s.scale, s.inv64, s.inv32); err != nil {
			return fmt.Errorf("ddp: gradient of %s: %w", d.params[pi].Name, err)
		}
	}
	s.mu.Lock()
	s.left--
	if inPlace {
		s.inBucket++
	} else {
		s.copied++
	}
	s.mu.Unlock()
	return s.markReady(pi)
}

// markReady counts parameter pi as ready in its bucket and hands every
// bucket that is complete, and whose predecessors have all been handed on, to
// the comm hook: buckets go out strictly in order, so every rank issues their
// collectives in the same order.
func (s *stepState) markReady(pi int) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.err != nil {
		return s.err
	}
	if s.recording {
		s.order = append(s.order, pi)
	}
	bi := s.d.bucketOf[pi]
	s.pending[bi]--
	if s.pending[bi] < 0 {
		s.err = fmt.Errorf("ddp: the gradient of %s became ready twice in one step: %w", s.d.params[pi].Name, ErrInvalidArgument)
		return s.err
	}
	for s.next < len(s.buckets) && s.pending[s.next] == 0 {
		s.launch(s.next)
		s.next++
	}
	return nil
}

// launch hands bucket bi to the comm hook (or starts the default
// all-reduce). It runs under s.mu.
func (s *stepState) launch(bi int) {
	b := s.buckets[bi]
	gb := b.gb
	gb.sent.Store(0)
	gb.reported.Store(false)
	s.launchAt[bi] = time.Now()
	if s.left > 0 && !s.afterBackward {
		s.overlapped++
	}
	f := s.d.reduce(s.ctx, gb)
	s.futures[bi] = f
	s.d.commActive.Store(true)
	if dn, ok := f.(doner); ok {
		if ch := dn.Done(); ch != nil {
			select {
			case <-ch: // finished already (a world of one, a hook that worked synchronously)
				s.doneAt[bi] = s.launchAt[bi]
				return
			default:
			}
			s.watchers.Add(1)
			go func() {
				defer s.watchers.Done()
				select {
				case <-ch:
					t := time.Now()
					s.mu.Lock()
					s.doneAt[bi] = t
					s.mu.Unlock()
				case <-s.stop:
				}
			}()
		}
	}
}

// reduce runs the comm hook, or the default reduction, on a bucket.
func (d *DDP) reduce(ctx context.Context, gb *GradBucket) (f Future) {
	if d.cfg.hook == nil {
		gb.CountSent(int64(gb.buf.Shape().TotalSize()) * int64(gb.buf.Dtype().Size()))
		if d.world == 1 {
			return Ready(gb.buf)
		}
		return WorkFuture(d.pg.AllReduce(ctx, gb.buf, comm.Sum), gb.buf)
	}
	defer func() {
		if r := recover(); r != nil {
			f = Failed(fmt.Errorf("ddp: comm hook panicked on bucket %d: %v", gb.index, r))
		}
	}()
	f = d.cfg.hook(ctx, gb)
	if f == nil {
		f = Failed(fmt.Errorf("ddp: comm hook returned a nil Future for bucket %d: %w", gb.index, ErrInvalidArgument))
	}
	return f
}

// finish waits for every bucket, in order, copies results the hooks returned
// in other tensors into the buckets, and points each parameter's Grad at its
// reduced gradient.
func (s *stepState) finish() error {
	d := s.d
	defer s.stopWatchers()
	s.mu.Lock()
	next, err := s.next, s.err
	s.mu.Unlock()
	if err != nil {
		return err
	}
	if next != len(s.buckets) {
		var missing []string
		for bi := next; bi < len(s.buckets) && len(missing) < 5; bi++ {
			if s.pending[bi] > 0 {
				missing = append(missing, fmt.Sprintf("bucket %d (%d gradients missing)", bi, s.pending[bi]))
			}
		}
		return fmt.Errorf("ddp: the backward pass ended with buckets still waiting for gradients: %v: %w", missing, ErrInvalidArgument)
	}
	for bi, f := range s.futures {
		t, err := f.Wait(s.ctx)
		if err != nil {
			return fmt.Errorf("ddp: reducing bucket %d: %w", bi, err)
		}
		b := s.buckets[bi]
		if t != b.buf {
			if err := copyInto(b.buf, t, fmt.Sprintf("result of the comm hook for bucket %d", bi)); err != nil {
				return err
			}
		}
		now := time.Now()
		s.mu.Lock()
		if s.doneAt[bi].IsZero() {
			s.doneAt[bi] = now
		}
		s.mu.Unlock()
		if b.gb.reported.Load() {
			s.sent += b.gb.sent.Load()
		} else {
			s.sent += int64(b.numel) * int64(b.dtype.Size())
		}
	}
	if s.usedWork != nil {
		if err := s.usedWork.Wait(s.ctx); err != nil {
			return fmt.Errorf("ddp: all-reducing the map of used parameters: %w", err)
		}
		s.globalUsed = boolsOf(s.usedMap)
	} else if d.cfg.staticGraph && d.staticUsed != nil {
		s.globalUsed = d.staticUsed
	}
	if s.shadow {
		return nil
	}
	for pi, p := range d.params {
		used := s.globalUsed == nil || s.globalUsed[pi]
		if used || d.hasGrad[pi] {
			p.Grad = d.view(pi)
			d.hasGrad[pi] = true
		}
	}
	return nil
}

// stopWatchers ends the goroutines timing the buckets.
func (s *stepState) stopWatchers() {
	s.d.commActive.Store(false)
	if s.stop == nil {
		return
	}
	select {
	case <-s.stop:
	default:
		close(s.stop)
	}
	s.watchers.Wait()
}

// abandon ends a step that failed before finish.
func (s *stepState) abandon() { s.stopWatchers() }

// addGrad writes the gradient value v into dst: dst = v, or dst + v when
// accum, times inv when scale (the default reduction's 1/world, applied as
// PyTorch's reducer does, by multiplying while copying).
func addGrad(dst *tensor.Dense, v G.Value, accum, scale bool, inv64 float64, inv32 float32) error {
	n := dst.Shape().TotalSize()
	switch dst.Dtype() {
	case tensor.Float64:
		src, err := valueData[float64](v, n)
		if err != nil {
			return err
		}
		applyGrad(dst.Float64s()[:n], src, accum, scale, inv64)
	case tensor.Float32:
		src, err := valueData[float32](v, n)
		if err != nil {
			return err
		}
		applyGrad(dst.Float32s()[:n], src, accum, scale, inv32)
	default:
		return fmt.Errorf("gradient buffer of dtype %v: %w", dst.Dtype(), ErrInvalidArgument)
	}
	return nil
}

func applyGrad[T float32 | float64](dst, src []T, accum, scale bool, inv T) {
	switch {
	case accum && scale:
		for i, g := range src {
			dst[i] = (dst[i] + g) * inv
		}
	case accum:
		for i, g := range src {
			dst[i] += g
		}
	case scale:
		for i, g := range src {
			dst[i] = g * inv
		}
	default:
		copy(dst, src)
	}
}

// sameMemory reports whether v covers exactly t's memory.
func sameMemory(v G.Value, t *tensor.Dense) bool {
	return v != nil && v.Uintptr() == t.Uintptr() && v.MemSize() == t.MemSize()
}

// scaleDense multiplies t by inv.
func scaleDense(t *tensor.Dense, inv64 float64, inv32 float32) {
	switch t.Dtype() {
	case tensor.Float64:
		for i := range t.Float64s() {
			t.Float64s()[i] *= inv64
		}
	case tensor.Float32:
		d := t.Float32s()
		for i := range d {
			d[i] *= inv32
		}
	}
}

// valueData returns the n elements of a gradient value of element type T.
func valueData[T float32 | float64](v G.Value, n int) ([]T, error) {
	switch x := v.(type) {
	case *tensor.Dense:
		if x.RequiresIterator() {
			x = x.Materialize().(*tensor.Dense)
		}
		data, ok := x.Data().([]T)
		if !ok {
			if x.IsScalar() && n == 1 {
				if s, ok := x.Data().(T); ok {
					return []T{s}, nil
				}
			}
			return nil, fmt.Errorf("gradient value of dtype %v where the parameter has another: %w", x.Dtype(), ErrInvalidArgument)
		}
		if len(data) != n {
			return nil, fmt.Errorf("gradient has %d elements, the parameter %d: %w", len(data), n, ErrInvalidArgument)
		}
		return data, nil
	case *G.F64:
		if s, ok := any(float64(*x)).(T); ok && n == 1 {
			return []T{s}, nil
		}
	case *G.F32:
		if s, ok := any(float32(*x)).(T); ok && n == 1 {
			return []T{s}, nil
		}
	}
	return nil, fmt.Errorf("gradient value %T of the wrong type or size: %w", v, ErrInvalidArgument)
}
