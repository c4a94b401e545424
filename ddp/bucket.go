package ddp

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"

	"gorgonia.org/tensor"

	"github.com/tandemml/tandem/comm"
	"github.com/tandemml/tandem/models"
)

// bucket is one group of parameters whose gradients are reduced together:
// a contiguous 1-D buffer of one dtype, and for each parameter a view of its
// slice of the buffer shaped like the parameter (the parameter's Grad once
// it has one).
type bucket struct {
	index   int
	dtype   tensor.Dtype
	params  []int // indices into DDP.params, in the bucket's order
	offsets []int // element offset of each parameter in buf
	numel   int
	buf     *tensor.Dense
	views   []*tensor.Dense
	gb      *GradBucket
	shared  *comm.SharedTensor // buf's shared memory (SharedBuckets), or nil
}

// assignBuckets packs parameters into buckets as c10d's Reducer does: it
// walks the parameters in the given order (the order their gradients are
// expected to become ready) keeping one open bucket per dtype; a bucket is
// closed as soon as its size reaches its cap, so the parameter that crosses
// the cap still joins it. The first bucket of each dtype is capped by
// limits[0], the second by limits[1], and so on, the last limit applying
// to all later ones. Buckets come out ordered by the walk position of their
// first parameter, so they become ready in order.
func assignBuckets(order []int, bytes []int64, dtypes []tensor.Dtype, limits []int64) [][]int {
	type open struct {
		params []int
		size   int64
		limit  int // index into limits
	}
	opened := map[tensor.Dtype]*open{}
	var dtOrder []tensor.Dtype
	var out [][]int
	for _, p := range order {
		dt := dtypes[p]
		o := opened[dt]
		if o == nil {
			o = &open{}
			opened[dt] = o
			dtOrder = append(dtOrder, dt)
		}
		o.params = append(o.params, p)
		o.size += bytes[p]
		if o.size >= limits[o.limit] {
			out = append(out, o.params)
			o.params, o.size = nil, 0
			if o.limit+1 < len(limits) {
				o.limit++
			}
		}
	}
	for _, dt := range dtOrder {
		if o := opened[dt]; len(o.params) > 0 {
			out = append(out, o.params)
		}
	}
	pos := make(map[int]int, len(order))
	for i, p := range order {
		pos[p] = i
	}
	slices.SortStableFunc(out, func(a, b []int) int { return pos[a[0]] - pos[b[0]] })
	return out
}

// bucketLimits returns the caps of the first and of the later buckets.
func (c *config) bucketLimits() []int64 {
	first := c.firstBucketCap
	if first < 0 {
		first = min(mib(DefaultFirstBucketCapMB), c.bucketCap)
	}
	return []int64{first, c.bucketCap}
}

// layoutBuckets allocates the buckets for an assignment and returns them
// with, for every parameter, its bucket and its position in it.
func layoutBuckets(ctx context.Context, params []*models.Param, assign [][]int, d *DDP) ([]*bucket, []int, []int, error) {
	bucketOf := make([]int, len(params))
	slotOf := make([]int, len(params))
	for i := range bucketOf {
		bucketOf[i] = -1
	}
	out := make([]*bucket, len(assign))
	for bi, ps := range assign {
		b := &bucket{index: bi, dtype: params[ps[0]].Value.Dtype(), params: slices.Clone(ps)}
		for k, pi := range ps {
			if bucketOf[pi] >= 0 {
				return nil, nil, nil, fmt.Errorf("ddp: parameter %q assigned to buckets %d and %d: %w", params[pi].Name, bucketOf[pi], bi, ErrInvalidArgument)
			}
			if params[pi].Value.Dtype() != b.dtype {
				return nil, nil, nil, fmt.Errorf("ddp: bucket %d mixes dtypes %v and %v: %w", bi, b.dtype, params[pi].Value.Dtype(), ErrInvalidArgument)
			}
			bucketOf[pi], slotOf[pi] = bi, k
			b.offsets = append(b.offsets, b.numel)
			b.numel += params[pi].Value.Shape().TotalSize()
		}
		if err := d.allocBucket(ctx, b); err != nil {
			closeShared(out[:bi])
			return nil, nil, nil, err
		}
		b.views = make([]*tensor.Dense, len(ps))
		for k, pi := range ps {
			b.views[k] = viewOf(b.buf, b.offsets[k], params[pi].Value.Shape())
		}
		b.gb = &GradBucket{index: bi, last: bi == len(assign)-1, buf: b.buf, grads: b.views, offsets: b.offsets, d: d, bucket: b}
		for _, pi := range ps {
			b.gb.params = append(b.gb.params, params[pi])
		}
		out[bi] = b
	}
	for pi, bi := range bucketOf {
		if bi < 0 {
			return nil, nil, nil, fmt.Errorf("ddp: parameter %q is in no bucket: %w", params[pi].Name, ErrInvalidArgument)
		}
	}
	return out, bucketOf, slotOf, nil
}

// allocBucket gives b its buffer of b.numel elements: shared memory with
// SharedBuckets where the group's transport allows it, ordinary memory
// otherwise.
func (d *DDP) allocBucket(ctx context.Context, b *bucket) error {
	if d.cfg.sharedBuckets && !d.noShared && d.pg != nil && d.world > 1 {
		st, err := d.pg.NewSharedTensor(ctx, b.dtype, b.numel)
		switch {
		case err == nil:
			b.shared, b.buf = st, st.Tensor()
			return nil
		case errors.Is(err, errors.ErrUnsupported):
			d.noShared = true // the same on every rank: the transport's kind
		case errors.Is(err, comm.ErrSharedUnavailable):
			// Every rank got it from the same call: this bucket and the
			// rest are private memory on all of them.
			d.noShared = true
			d.pg.Logger().LogAttrs(ctx, slog.LevelWarn, "ddp: gradient buckets in private memory, as shared memory could not be had",
				slog.String("group", d.pg.Name()), slog.Int("bucket", b.index), slog.Int("bytes", b.numel*int(b.dtype.Size())), slog.String("error", err.Error()))
		default:
			return fmt.Errorf("ddp: making bucket %d's shared memory: %w", b.index, err)
		}
	}
	b.buf = tensor.New(tensor.Of(b.dtype), tensor.WithShape(b.numel))
	return nil
}

// closeShared gives back the shared memory of buckets, keeping their values
// (comm.SharedTensor.Close).
func closeShared(bs []*bucket) {
	for _, b := range bs {
		if b != nil && b.shared != nil {
			b.shared.Close()
		}
	}
}

// viewOf returns a tensor of the given shape over buf's elements from off:
// it shares buf's memory.
func viewOf(buf *tensor.Dense, off int, shape tensor.Shape) *tensor.Dense {
	n := shape.TotalSize()
	var backing any
	switch buf.Dtype() {
	case tensor.Float64:
		backing = buf.Float64s()[off : off+n : off+n]
	case tensor.Float32:
		backing = buf.Float32s()[off : off+n : off+n]
	default:
		panic(fmt.Sprintf("ddp: bucket of dtype %v", buf.Dtype()))
	}
	if shape.IsScalar() {
		return tensor.New(tensor.WithShape(), tensor.WithBacking(backing))
	}
	return tensor.New(tensor.WithShape(shape.Clone()...), tensor.WithBacking(backing))
}

// zeroDense writes zeros into t.
func zeroDense(t *tensor.Dense) {
	switch t.Dtype() {
	case tensor.Float64:
		clear(t.Float64s())
	case tensor.Float32:
		clear(t.Float32s())
	}
}
