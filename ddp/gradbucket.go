package ddp

import (
	"context"
	"fmt"
	"sync/atomic"

	"gorgonia.org/tensor"

	"github.com/tandemml/tandem/comm"
	"github.com/tandemml/tandem/models"
)

// CommHook reduces one bucket of gradients across the ranks (PyTorch's DDP
// communication hook). DDP calls it once per bucket and step, in bucket
// order, as soon as the bucket's gradients are all ready, on the goroutine
// that computed the last of them, while the backward pass goes on. ctx is the
// step's context; state is the value given to WithCommHook.
//
// The bucket's buffer holds this rank's gradients, not yet divided by the
// world size. The hook starts the collectives it needs and returns at once
// with a Future of the averaged gradients (sum over the ranks divided by the
// world size, or an approximation of it); slow local work belongs in the
// Future, not in the call. Rules that keep the ranks in step:
//
//   - every rank's hook issues the same collectives, in the same order, on
//     every call (collectives are matched by order);
//   - collectives are issued either in the call itself or inside the
//     Future's Wait, never from other goroutines the hook starts;
//   - the hook may keep state between calls (error feedback), keyed by
//     GradBucket.Index: bucket indices and layouts stay the same from step to
//     step, except once, after the first step, when DDP rebuilds the buckets in
//     the order gradients actually became ready.
//
// A rank that has joined (see DDP.Join) calls the hook with a bucket of
// zeros to shadow the others.
type CommHook[S any] func(ctx context.Context, state S, b *GradBucket) Future

// hookFunc is a CommHook with its state bound.
type hookFunc func(ctx context.Context, b *GradBucket) Future

// GradBucket is what a CommHook gets: one bucket of gradients, flattened into
// a contiguous buffer, with views of each parameter's slice of it.
type GradBucket struct {
	index   int
	last    bool
	buf     *tensor.Dense
	grads   []*tensor.Dense
	params  []*models.Param
	offsets []int
	d       *DDP
	shadow  bool
	bucket  *bucket

	sent     atomic.Int64
	reported atomic.Bool
}

// Index returns the bucket's position: bucket 0 is reduced first.
func (b *GradBucket) Index() int { return b.index }

// IsLast reports whether this is the last bucket of the step.
func (b *GradBucket) IsLast() bool { return b.last }

// Buffer returns the bucket's gradients flattened into one 1-D tensor. A hook
// may change it in place (and usually leaves the reduced result in it).
func (b *GradBucket) Buffer() *tensor.Dense { return b.buf }

// Gradients returns one tensor per parameter, shaped like the parameter,
// each a view of its slice of Buffer (writing into one writes into Buffer).
func (b *GradBucket) Gradients() []*tensor.Dense { return b.grads }

// Parameters returns the bucket's parameters, parallel to Gradients.
func (b *GradBucket) Parameters() []*models.Param { return b.params }

// Offsets returns the element offset of each parameter's slice in Buffer,
// parallel to Gradients.
func (b *GradBucket) Offsets() []int { return b.offsets }

// Shadow reports whether the bucket is a joined rank's bucket of zeros,
// passed to the hook only to take part in the other ranks' collectives.
func (b *GradBucket) Shadow() bool { return b.shadow }

// Group returns the process group of the DDP the bucket belongs to.
func (b *GradBucket) Group() *comm.ProcessGroup { return b.d.pg }

// SetBuffer copies t, a tensor of the buffer's dtype and number of elements,
// into the buffer (and so into every gradient view).
func (b *GradBucket) SetBuffer(t *tensor.Dense) error {
	if t == b.buf {
		return nil
	}
	return copyInto(b.buf, t, fmt.Sprintf("bucket %d", b.index))
}

// CountSent adds n bytes to what this rank reports as sent for the bucket in
// Stats.BytesSent. Hooks that compress call it with the size of what they
// hand to collectives; for a hook that never calls it, DDP counts the
// bucket's buffer once per step.
func (b *GradBucket) CountSent(n int64) {
	b.sent.Add(n)
	b.reported.Store(true)
}

// copyInto copies src into dst (same dtype, same number of elements).
func copyInto(dst, src *tensor.Dense, what string) error {
	if src == nil {
		return fmt.Errorf("ddp: %s: nil result tensor: %w", what, ErrInvalidArgument)
	}
	if src.Dtype() != dst.Dtype() || src.Shape().TotalSize() != dst.Shape().TotalSize() {
		return fmt.Errorf("ddp: %s: result is %v of %d elements, the buffer %v of %d: %w",
			what, src.Dtype(), src.Shape().TotalSize(), dst.Dtype(), dst.Shape().TotalSize(), ErrInvalidArgument)
	}
	if src.RequiresIterator() {
		src = src.Materialize().(*tensor.Dense)
	}
	switch dst.Dtype() {
	case tensor.Float64:
		copy(dst.Float64s(), src.Float64s())
	case tensor.Float32:
		copy(dst.Float32s(), src.Float32s())
	default:
		return fmt.Errorf("ddp: %s: dtype %v: %w", what, dst.Dtype(), ErrInvalidArgument)
	}
	return nil
}
