package ddp

import (
	"context"
	"fmt"
	"unsafe"

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
// IEEE half precision, divided by the world size (in half precision), summed
// across the ranks in half precision and widened back, which halves the
// bytes sent for float32 gradients (a quarter for float64) at the price of
// half precision's 11-bit significand and range (about 6e-8 to 65504).
//
// The sum runs as a ring reduce-scatter and all-gather over point-to-point
// messages on a goroutine of its own, so it overlaps with the backward pass
// like a plain all-reduce; each chunk is summed by one rank, rank after rank
// in ring order, rounding to half after every addition, so every rank ends
// with bit-identical gradients. It uses point-to-point tags from 2^47 up on
// pg (nil: the DDP's group).
func FP16CompressHook(ctx context.Context, pg *comm.ProcessGroup, b *GradBucket) Future {
	return compressHook(ctx, pg, b, float16)
}

// BF16CompressHook is FP16CompressHook with bfloat16 (PyTorch's
// bf16_compress_hook): float32's range with an 8-bit significand.
func BF16CompressHook(ctx context.Context, pg *comm.ProcessGroup, b *GradBucket) Future {
	return compressHook(ctx, pg, b, bfloat16)
}

// hookTagBase is the first point-to-point tag the built-in hooks use.
const hookTagBase = 1 << 47

func compressHook(ctx context.Context, pg *comm.ProcessGroup, b *GradBucket, f halfFormat) Future {
	if pg == nil {
		pg = b.Group()
	}
	buf := b.Buffer()
	n, r := pg.Size(), pg.Rank()
	numel := buf.Shape().TotalSize()
	chunk := (numel + n - 1) / n
	h := make([]uint16, chunk*n)
	div := float32(n)
	switch buf.Dtype() {
	case tensor.Float64:
		for i, v := range buf.Float64s() {
			h[i] = f.from(f.to(f.from(float32(v))) / div)
		}
	case tensor.Float32:
		for i, v := range buf.Float32s() {
			h[i] = f.from(f.to(f.from(v)) / div)
		}
	default:
		return Failed(fmt.Errorf("ddp: %s compression of a %v bucket: %w", f.name, buf.Dtype(), ErrInvalidArgument))
	}
	b.CountSent(int64(2 * numel))
	done := make(chan struct{})
	fut := &compressFuture{done: done, buf: buf, h: h[:numel], f: f}
	if n == 1 {
		close(done)
		return fut
	}
	tag := hookTagBase + int(b.seq%(1<<40))
	go func() {
		defer close(done)
		fut.err = ringHalfAllReduce(ctx, pg, h, chunk, n, r, tag, f)
	}()
	return fut
}

// ringHalfAllReduce sums h (n chunks of chunk values) across the ranks of pg
// in the half format f, in place: a ring reduce-scatter, then a ring
// all-gather, each step sending one chunk right and receiving one from the
// left under one tag.
func ringHalfAllReduce(ctx context.Context, pg *comm.ProcessGroup, h []uint16, chunk, n, r, tag int, f halfFormat) error {
	right, left := (r+1)%n, (r-1+n)%n
	part := func(i int) []uint16 { i = ((i % n) + n) % n; return h[i*chunk : (i+1)*chunk] }
	recv := make([]uint16, chunk)
	exchange := func(send []uint16) error {
		w := pg.ISend(ctx, bytesTensor(send), right, tag)
		if err := pg.Recv(ctx, bytesTensor(recv), left, tag); err != nil {
			w.Wait(ctx)
			return err
		}
		return w.Wait(ctx)
	}
	for s := 0; s < n-1; s++ {
		if err := exchange(part(r - s)); err != nil {
			return fmt.Errorf("ddp: %s ring reduce-scatter: %w", f.name, err)
		}
		dst := part(r - s - 1)
		for i, v := range recv {
			dst[i] = f.add(v, dst[i])
		}
	}
	for s := 0; s < n-1; s++ {
		if err := exchange(part(r + 1 - s)); err != nil {
			return fmt.Errorf("ddp: %s ring all-gather: %w", f.name, err)
		}
		copy(part(r-s), recv)
	}
	return nil
}

// bytesTensor views a []uint16 as a uint8 tensor (collectives do not carry
// 16-bit types).
func bytesTensor(h []uint16) *tensor.Dense {
	b := unsafe.Slice((*uint8)(unsafe.Pointer(unsafe.SliceData(h))), 2*len(h))
	return tensor.New(tensor.WithShape(len(b)), tensor.WithBacking(b))
}

// compressFuture completes when the half-precision sum is done and widens
// it back into the bucket.
type compressFuture struct {
	done chan struct{}
	err  error
	buf  *tensor.Dense
	h    []uint16
	f    halfFormat
}

func (c *compressFuture) Done() <-chan struct{} { return c.done }

func (c *compressFuture) Wait(ctx context.Context) (*tensor.Dense, error) {
	select {
	case <-c.done:
	case <-ctx.Done():
		return nil, fmt.Errorf("ddp: waiting for a %s reduction: %w: %w", c.f.name, comm.ErrTimeout, ctx.Err())
	}
	if c.err != nil {
		return nil, c.err
	}
	switch c.buf.Dtype() {
	case tensor.Float64:
		d := c.buf.Float64s()
		for i, v := range c.h {
			d[i] = float64(c.f.to(v))
		}
	case tensor.Float32:
		d := c.buf.Float32s()
		for i, v := range c.h {
			d[i] = c.f.to(v)
		}
	}
	return c.buf, nil
}
