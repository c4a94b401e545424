package ddp

import (
	"context"
	"fmt"

	"gorgonia.org/tensor"

	"github.com/tandemml/tandem/comm"
)

// AllReduceHook is PyTorch's allreduce_hook: it divides the bucket by the
// world size and all-reduces it with a sum. The result equals the default
// reduction's up to the last bit (the default multiplies by 1/world while
// copying gradients in, as PyTorch's built-in reduction does; for world sizes
// that are powers of two the two are identical). pg is the group to reduce
// over; nil means the DDP's group.
func AllReduceHook(ctx context.Context, pg *comm.ProcessGroup, b *GradBucket) Future {
	if pg == nil {
		pg = b.Group()
	}
	buf := b.Buffer()
	n := pg.Size()
	switch buf.Dtype() {
	case tensor.Float64:
		for i, v := range buf.Float64s() {
			buf.Float64s()[i] = v / float64(n)
		}
	case tensor.Float32:
		d := buf.Float32s()
		for i, v := range d {
			d[i] = v / float32(n)
		}
	}
	b.CountSent(int64(buf.Shape().TotalSize()) * int64(buf.Dtype().Size()))
	if n == 1 {
		return Ready(buf)
	}
	return WorkFuture(pg.AllReduce(ctx, buf, comm.Sum), buf)
}

// FP16CompressHook is PyTorch's fp16_compress_hook: the bucket is rounded to
// IEEE half precision, divided by the world size (in half precision, as
// PyTorch divides the half tensor), all-reduced as a float16 tensor and
// widened back, which halves the bytes sent for float32 gradients (a quarter
// for float64) at the price of half precision's 11-bit significand and range
// (about 6e-8 to 65504).
//
// The all-reduce is the ordinary one on a comm.Float16Dtype tensor: the
// ranks' half values are summed in float32, in rank order, and rounded to
// half once, so every rank ends with bit-identical gradients. PyTorch over
// gloo rounds each partial sum of its ring instead; with two ranks the two
// agree bit for bit, with more the result here is the more accurate. pg is
// the group to reduce over; nil means the DDP's group.
func FP16CompressHook(ctx context.Context, pg *comm.ProcessGroup, b *GradBucket) Future {
	return compressHook(ctx, pg, b, float16)
}

// BF16CompressHook is FP16CompressHook with bfloat16 (PyTorch's
// bf16_compress_hook): float32's range with an 8-bit significand.
func BF16CompressHook(ctx context.Context, pg *comm.ProcessGroup, b *GradBucket) Future {
	return compressHook(ctx, pg, b, bfloat16)
}

func compressHook(ctx context.Context, pg *comm.ProcessGroup, b *GradBucket, f halfFormat) Future {
	if pg == nil {
		pg = b.Group()
	}
	buf := b.Buffer()
	n := pg.Size()
	numel := buf.Shape().TotalSize()
	h := make([]uint16, numel)
	ht := f.tensor(h)
	if buf.Dtype() != tensor.Float32 && buf.Dtype() != tensor.Float64 {
		return Failed(fmt.Errorf("ddp: %s compression of a %v bucket: %w", f.name, buf.Dtype(), ErrInvalidArgument))
	}
	// h = half(half(v) / n), a block at a time in float32 scratch that stays
	// in the cache: rounding, division and rounding back are vector passes
	const block = 2048
	var scratch [block]float32
	div := float32(n)
	for lo := 0; lo < numel; lo += block {
		hi := min(lo+block, numel)
		w, hb := scratch[:hi-lo], h[lo:hi]
		if buf.Dtype() == tensor.Float64 {
			for i, v := range buf.Float64s()[lo:hi] {
				w[i] = float32(v)
			}
		} else {
			copy(w, buf.Float32s()[lo:hi])
		}
		f.narrow(hb, w)
		f.widen(w, hb)
		for i := range w {
			w[i] /= div
		}
		f.narrow(hb, w)
	}
	b.CountSent(int64(2 * numel))
	widen := func(context.Context, *tensor.Dense) (*tensor.Dense, error) {
		if buf.Dtype() == tensor.Float32 {
			f.widen(buf.Float32s(), h)
			return buf, nil
		}
		var w [block]float32
		d := buf.Float64s()
		for lo := 0; lo < numel; lo += block {
			hi := min(lo+block, numel)
			f.widen(w[:hi-lo], h[lo:hi])
			for i, v := range w[:hi-lo] {
				d[lo+i] = float64(v)
			}
		}
		return buf, nil
	}
	if n == 1 || numel == 0 {
		return Then(Ready(ht), widen)
	}
	return Then(WorkFuture(pg.AllReduce(ctx, ht, comm.Sum), ht), widen)
}
