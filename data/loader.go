package data

import (
	"context"
	"errors"
	"fmt"
	"iter"
	"slices"
	"sync"

	"github.com/tandemml/tandem/internal/errs"
	"gorgonia.org/tensor"
)

// Batch is a run of consecutive examples of an epoch's order.
type Batch struct {
	Epoch int // the epoch it belongs to
	Index int // its position in the epoch, from 0
	// X holds the features, shape [B, example shape...], float32 unless the
	// Loader was built with Dtype(tensor.Float64). From a TensorSet, X is
	// its first field.
	X *tensor.Dense
	// Y holds the labels, int64, shape [B]. From a TensorSet, Y is its
	// second field (nil when it has one), of that field's dtype.
	Y *tensor.Dense
	// Tensors holds one tensor per field, [B, field shape...], in the order
	// of Names: a TensorSet's fields, or X and Y (named "x" and "y") for a
	// Dataset.
	Tensors []*tensor.Dense
	// Names names Tensors.
	Names []string
	// Indices are the data set indices of the B rows.
	Indices []int
}

// Size is the number of examples in the batch.
func (b *Batch) Size() int { return len(b.Indices) }

// Labels returns the labels as a slice (shared with Y). Y must be int64, as
// a Dataset's labels are.
func (b *Batch) Labels() []int64 { return b.Y.Int64s() }

// Feeds returns the batch's tensors by field name, a fresh map of the same
// tensors (for a step that takes named inputs).
func (b *Batch) Feeds() map[string]*tensor.Dense {
	m := make(map[string]*tensor.Dense, len(b.Names))
	for i, n := range b.Names {
		m[n] = b.Tensors[i]
	}
	return m
}

// Tensor returns the batch's tensor of the field called name, or nil when
// there is none.
func (b *Batch) Tensor(name string) *tensor.Dense {
	for i, n := range b.Names {
		if n == name {
			return b.Tensors[i]
		}
	}
	return nil
}

// Loader cuts epochs of a Dataset into batches, assembling them on
// background goroutines ahead of the consumer. A Loader is immutable and safe
// for concurrent use; each epoch's iteration is independent.
type Loader struct {
	ds        Dataset   // a labelled data set, or nil
	ts        TensorSet // or a set of tensors
	fields    []Field   // ts's fields
	fsizes    []int     // elements per example of each field
	batchSize int
	sampler   Sampler
	dropLast  bool
	prefetch  int
	workers   int
	dtype     tensor.Dtype
	shape     []int
	size      int
}

// NewLoader returns a loader over ds with batchSize examples per batch.
// Options: Shuffle(seed) (random order per epoch; default: in order),
// WithSampler (excludes Shuffle), DropLast, Prefetch (default 2), Workers
// (default 1), Dtype (default float32).
func NewLoader(ds Dataset, batchSize int, opts ...Option) (*Loader, error) {
	if ds == nil {
		return nil, fmt.Errorf("data: Loader: nil data set: %w", ErrInvalidArgument)
	}
	l, err := newLoader(ds.Len(), batchSize, []string{"Shuffle", "WithSampler", "DropLast", "Prefetch", "Workers", "Dtype"}, opts)
	if err != nil {
		return nil, err
	}
	shape := ds.Shape()
	size := 1
	for _, d := range shape {
		if d <= 0 {
			return nil, fmt.Errorf("data: Loader: data set example shape %v has a non-positive dimension: %w", shape, ErrInvalidArgument)
		}
		size *= d
	}
	l.ds, l.shape, l.size = ds, shape, size
	return l, nil
}

// NewTensorLoader returns a loader over the TensorSet ts with batchSize
// examples per batch: each Batch holds one tensor per field, [B, field
// shape...], of the field's dtype, named in Batch.Names. Options: Shuffle,
// WithSampler (a DistributedSampler shards it across ranks exactly as it
// shards a Dataset), DropLast, Prefetch, Workers; the fields keep their own
// dtypes, so Dtype is refused.
func NewTensorLoader(ts TensorSet, batchSize int, opts ...Option) (*Loader, error) {
	if ts == nil {
		return nil, fmt.Errorf("data: Loader: nil data set: %w", ErrInvalidArgument)
	}
	fields := ts.Fields()
	if len(fields) == 0 {
		return nil, fmt.Errorf("data: Loader: the data set has no fields: %w", ErrInvalidArgument)
	}
	l, err := newLoader(ts.Len(), batchSize, []string{"Shuffle", "WithSampler", "DropLast", "Prefetch", "Workers"}, opts)
	if err != nil {
		return nil, err
	}
	for i, f := range fields {
		for _, d := range f.Shape {
			if d <= 0 {
				return nil, fmt.Errorf("data: Loader: field %q has example shape %v with a non-positive dimension: %w", f.Name, f.Shape, ErrInvalidArgument)
			}
		}
		if f.Dtype.Type == nil {
			return nil, fmt.Errorf("data: Loader: field %q has no dtype: %w", f.Name, ErrInvalidArgument)
		}
		if f.Name == "" || slices.ContainsFunc(fields[:i], func(g Field) bool { return g.Name == f.Name }) {
			return nil, fmt.Errorf("data: Loader: field %d has an empty or repeated name %q: %w", i, f.Name, ErrInvalidArgument)
		}
		l.fsizes = append(l.fsizes, f.size())
	}
	l.ts, l.fields = ts, fields
	return l, nil
}

// newLoader applies the options common to both kinds of data set over n
// examples.
func newLoader(n, batchSize int, allowed []string, opts []Option) (*Loader, error) {
	o := options{prefetch: 2, workers: 1, dtype: tensor.Float32}
	if err := o.apply("Loader", allowed, opts); err != nil {
		return nil, err
	}
	if batchSize < 1 {
		return nil, fmt.Errorf("data: Loader: batch size %d (need at least 1): %w", batchSize, ErrInvalidArgument)
	}
	if o.prefetch < 1 || o.workers < 1 {
		return nil, fmt.Errorf("data: Loader: Prefetch %d and Workers %d must be at least 1: %w", o.prefetch, o.workers, ErrInvalidArgument)
	}
	if o.dtype != tensor.Float32 && o.dtype != tensor.Float64 {
		return nil, fmt.Errorf("data: Loader: Dtype %v (want float32 or float64): %w", o.dtype, ErrInvalidArgument)
	}
	if o.set["WithSampler"] && o.set["Shuffle"] {
		return nil, fmt.Errorf("data: Loader: WithSampler and Shuffle exclude each other (let the sampler shuffle): %w", ErrInvalidArgument)
	}
	if o.set["WithSampler"] && o.sampler == nil {
		return nil, fmt.Errorf("data: Loader: nil sampler: %w", ErrInvalidArgument)
	}
	s := o.sampler
	if s == nil {
		if o.shuffle {
			s = &RandomSampler{n: n, seed: o.seed}
		} else {
			s = &SequentialSampler{n: n}
		}
	}
	return &Loader{batchSize: batchSize, sampler: s, dropLast: o.dropLast, prefetch: o.prefetch,
		workers: o.workers, dtype: o.dtype}, nil
}

// Len is the number of batches per epoch.
func (l *Loader) Len() int { return l.numBatches(l.sampler.Len()) }

func (l *Loader) numBatches(n int) int {
	if l.dropLast {
		return n / l.batchSize
	}
	return (n + l.batchSize - 1) / l.batchSize
}

// Epoch returns the batches of one epoch as a sequence for a range loop.
// Each step yields a batch and a nil error, or, once, a nil batch and the
// error that ended the epoch early (a data set error, or ctx's cancellation
// or deadline). Breaking out of the loop stops the background work.
func (l *Loader) Epoch(ctx context.Context, epoch int) iter.Seq2[*Batch, error] {
	return func(yield func(*Batch, error) bool) {
		it := l.Iterate(ctx, epoch)
		defer it.Close()
		for it.Next() {
			if !yield(it.Batch(), nil) {
				return
			}
		}
		if err := it.Err(); err != nil {
			yield(nil, err)
		}
	}
}

// Iterate starts assembling the batches of one epoch and returns an
// iterator over them. The caller must call Close, which waits for the
// workers to exit; once Next has returned false they are already stopping.
func (l *Loader) Iterate(ctx context.Context, epoch int) *Iter {
	order := l.sampler.Indices(epoch)
	nb := l.numBatches(len(order))
	cctx, cancel := context.WithCancel(ctx)
	it := &Iter{l: l, parent: ctx, ctx: cctx, cancel: cancel, epoch: epoch, total: nb,
		chans: make([]chan result, l.workers)}
	per := (l.prefetch + l.workers - 1) / l.workers
	for w := range it.chans {
		it.chans[w] = make(chan result, per)
	}
	it.wg.Add(l.workers)
	for w := 0; w < l.workers; w++ {
		go it.work(w, order)
	}
	return it
}

type result struct {
	b   *Batch
	err error
}

// Iter walks the batches of one epoch:
//
//	it := loader.Iterate(ctx, epoch)
//	defer it.Close()
//	for it.Next() {
//		b := it.Batch()
//	}
//	if err := it.Err(); err != nil { ... }
//
// Worker w assembles batches w, w+W, w+2W, ... into its own bounded channel;
// Next reads the channels in turn, so batches arrive in order and at most
// about Prefetch of them wait ready.
type Iter struct {
	l      *Loader
	parent context.Context
	ctx    context.Context
	cancel context.CancelFunc
	epoch  int
	total  int
	chans  []chan result
	wg     sync.WaitGroup

	next   int
	cur    *Batch
	err    error
	done   bool
	closed sync.Once
}

func (it *Iter) work(w int, order []int) {
	defer it.wg.Done()
	for k := w; k < it.total; k += len(it.chans) {
		if it.ctx.Err() != nil {
			return
		}
		b, err := it.l.build(it.ctx, it.epoch, k, order)
		if it.ctx.Err() != nil {
			return
		}
		select {
		case it.chans[w] <- result{b, err}:
		case <-it.ctx.Done():
			return
		}
		if err != nil {
			return
		}
	}
}

// build assembles batch k of order, giving up (with a nil batch) when ctx
// ends.
func (l *Loader) build(ctx context.Context, epoch, k int, order []int) (*Batch, error) {
	lo := k * l.batchSize
	hi := min(lo+l.batchSize, len(order))
	return l.buildIndices(ctx, epoch, k, order[lo:hi:hi])
}

// Batch assembles one batch of exactly the examples indices, in that order,
// with the loader's settings (dtype, fields) but not its sampler or batch
// size: for a caller that chooses each step's examples itself, as package
// elastic's Round.Shard does when the world's size changes mid-epoch. The
// batch's Epoch and Index are -1.
func (l *Loader) Batch(ctx context.Context, indices []int) (*Batch, error) {
	n := 0
	if l.ts != nil {
		n = l.ts.Len()
	} else {
		n = l.ds.Len()
	}
	for _, i := range indices {
		if i < 0 || i >= n {
			return nil, fmt.Errorf("data: Loader.Batch: index %d out of range [0, %d): %w", i, n, ErrInvalidArgument)
		}
	}
	b, err := l.buildIndices(ctx, -1, -1, indices)
	if err == nil && b == nil {
		err = fmt.Errorf("data: Loader.Batch: %w", context.Cause(ctx))
	}
	return b, err
}

// buildIndices assembles the batch of the examples idx.
func (l *Loader) buildIndices(ctx context.Context, epoch, k int, idx []int) (*Batch, error) {
	if l.ts != nil {
		return l.buildTensors(ctx, epoch, k, idx)
	}
	n := len(idx)
	x := make([]float32, n*l.size)
	y := make([]int64, n)
	for r, i := range idx {
		if ctx.Err() != nil {
			return nil, nil
		}
		label, err := l.ds.Get(i, x[r*l.size:(r+1)*l.size:(r+1)*l.size])
		if err != nil {
			return nil, fmt.Errorf("data: epoch %d batch %d: example %d: %w", epoch, k, i, err)
		}
		y[r] = int64(label)
	}
	shape := append([]int{n}, l.shape...)
	var X *tensor.Dense
	if l.dtype == tensor.Float64 {
		x64 := make([]float64, len(x))
		for i, v := range x {
			x64[i] = float64(v)
		}
		X = tensor.New(tensor.WithShape(shape...), tensor.WithBacking(x64))
	} else {
		X = tensor.New(tensor.WithShape(shape...), tensor.WithBacking(x))
	}
	Y := tensor.New(tensor.WithShape(n), tensor.WithBacking(y))
	return &Batch{Epoch: epoch, Index: k, X: X, Y: Y, Tensors: []*tensor.Dense{X, Y}, Names: []string{"x", "y"},
		Indices: append([]int(nil), idx...)}, nil
}

// buildTensors assembles the batch of the examples idx of a TensorSet, each
// example read straight into its rows of the batch's tensors.
func (l *Loader) buildTensors(ctx context.Context, epoch, k int, idx []int) (*Batch, error) {
	n := len(idx)
	b := &Batch{Epoch: epoch, Index: k, Indices: append([]int(nil), idx...)}
	bufs := make([]any, len(l.fields))
	for f, field := range l.fields {
		t := tensor.New(tensor.Of(field.Dtype), tensor.WithShape(append([]int{n}, field.Shape...)...))
		b.Tensors = append(b.Tensors, t)
		b.Names = append(b.Names, field.Name)
		bufs[f] = t.Data()
	}
	rows := make([]any, len(l.fields))
	for r, i := range idx {
		if ctx.Err() != nil {
			return nil, nil
		}
		for f, size := range l.fsizes {
			rows[f] = rowOf(bufs[f], r*size, (r+1)*size)
		}
		if err := l.ts.Read(i, rows); err != nil {
			return nil, fmt.Errorf("data: epoch %d batch %d: example %d: %w", epoch, k, i, err)
		}
	}
	b.X = b.Tensors[0]
	if len(b.Tensors) > 1 {
		b.Y = b.Tensors[1]
	}
	return b, nil
}

// Next waits for the next batch. It returns false at the end of the epoch,
// after an error (see Err), or after Close.
func (it *Iter) Next() bool {
	if it.done {
		return false
	}
	if it.ctx.Err() != nil {
		it.finish(it.stopErr())
		return false
	}
	if it.next >= it.total {
		it.finish(nil)
		return false
	}
	select {
	case r, ok := <-it.chans[it.next%len(it.chans)]:
		if !ok || r.err != nil {
			err := r.err
			if !ok || err == nil {
				err = it.stopErr()
			}
			it.finish(err)
			return false
		}
		it.cur = r.b
		it.next++
		return true
	case <-it.ctx.Done():
		it.finish(it.stopErr())
		return false
	}
}

// stopErr explains why the workers stopped: the caller's context, or Close.
func (it *Iter) stopErr() error {
	switch err := it.parent.Err(); {
	case errors.Is(err, context.DeadlineExceeded):
		return fmt.Errorf("%w: data: epoch %d stopped before batch %d of %d: %w", errs.Timeout, it.epoch, it.next, it.total, err)
	case err != nil:
		return fmt.Errorf("data: epoch %d stopped before batch %d of %d: %w", it.epoch, it.next, it.total, err)
	}
	return nil // closed by the consumer
}

// finish ends the iteration: it stops the workers without waiting for them,
// so that a Get stuck in the data set cannot delay the caller's error; Close
// waits.
func (it *Iter) finish(err error) {
	it.done, it.cur, it.err = true, nil, err
	it.cancel()
}

// Batch is the batch Next moved to (nil before the first Next and after the
// end).
func (it *Iter) Batch() *Batch { return it.cur }

// Err is the error that ended the epoch early, nil after a complete epoch or
// a Close.
func (it *Iter) Err() error { return it.err }

// Close stops the workers and waits for them to exit (each finishes the Get
// call it is in, if any); Next then returns false. It is safe to call more than once, after the end of the epoch, and
// from another goroutine than the one calling Next (the other methods belong
// to the consuming goroutine).
func (it *Iter) Close() error {
	it.closed.Do(func() {
		it.cancel()
		it.wg.Wait()
	})
	return nil
}
