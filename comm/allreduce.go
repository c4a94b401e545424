package comm

import (
	"context"
	"fmt"
	"strings"

	"gorgonia.org/tensor"
)

// AllReduce reduces t across the group with op and leaves the result in t on
// every rank (in place). Every rank passes a tensor of the same dtype and
// shape. Buffers of at least WithRingThreshold bytes use a pipelined ring
// (reduce-scatter then all-gather, bandwidth-optimal); smaller ones use
// recursive doubling (latency-optimal). When every rank runs on this host
// (the shm backend, in-process ranks), all-reduce goes through the group's
// staging segment instead, whole or by blocks on the same threshold (see
// the package documentation, WithStaging). When the group's ranks run on
// several hosts, several of them on some host (the automatic backend's
// layout, see AutoBackend), all-reduce runs hierarchically instead: reduce
// inside each host, the same choice of algorithms between one leader per
// host, broadcast inside each host. Every rank ends with bit-identical
// values.
func (pg *ProcessGroup) AllReduce(ctx context.Context, t *tensor.Dense, op ReduceOp) Work {
	buf, err := tensorBuffer(t, "all_reduce tensor")
	if err == nil {
		err = op.checkFor(buf.dt)
	}
	desc := fmt.Sprintf("all_reduce(%v,%s,%v)", buf.dt, shapeString(buf.shape), op)
	seg, off := pg.sharedOf(buf.b)
	if seg != nil {
		// Every member must take the same path: the fingerprints tell a
		// member whose tensor is elsewhere.
		desc += fmt.Sprintf(" in shared %s at %d", seg.name, off)
	}
	var one func(*stage) (oneBuffer, bool)
	if seg == nil && !buf.dt.isHalf() && len(buf.b) > 0 {
		one = func(st *stage) (oneBuffer, bool) {
			// allReduceBytes's choice: reduceTo's path in one buffer.
			if len(buf.b) >= pg.opts.ringThreshold || len(buf.b) > st.block {
				return oneBuffer{}, false
			}
			return oneBuffer{b: buf.b, comb: reduction(buf.dt, op, len(pg.members)), prepare: premultiply(buf.b, buf.dt, op)}, true
		}
	}
	return pg.start(ctx, collective{name: "all_reduce", desc: desc, invalid: err, oneBuffer: one,
		run: func(ctx context.Context, c *opCtx) error {
			if seg != nil && !buf.dt.isHalf() && len(buf.b) >= pg.opts.ringThreshold && len(buf.b)/buf.dt.size() >= c.size() {
				return sharedAllReduceOp(ctx, c, seg, off, buf.b, buf.dt, op)
			}
			return allReduceBytes(ctx, c, buf.b, buf.dt, op)
		}})
}

// reduction is the staged combiner of op over n ranks' tensors of dt.
func reduction(dt dtype, op ReduceOp, n int) *numbers {
	m := &numbers{dt: dt, k: op.kind}
	if op.kind == KindAvg {
		m.finalize = func(p []byte) { divideBuf(p, dt, n) }
	}
	return m
}

// premultiply returns what scales b before a premultiplied sum, or nil for
// the other kinds.
func premultiply(b []byte, dt dtype, op ReduceOp) func() {
	if op.kind != KindPremulSum {
		return nil
	}
	return func() { scaleBuf(b, dt, op.factor) }
}

// AllReduceCoalesced all-reduces several tensors of one dtype as a single
// collective (one message stream instead of one per tensor), in place.
func (pg *ProcessGroup) AllReduceCoalesced(ctx context.Context, ts []*tensor.Dense, op ReduceOp) Work {
	bufs := make([]buffer, len(ts))
	var err error
	shapes := make([]string, len(ts))
	total := 0
	for i, t := range ts {
		var e error
		bufs[i], e = tensorBuffer(t, fmt.Sprintf("all_reduce_coalesced tensor %d", i))
		if e == nil && i > 0 && bufs[i].dt != bufs[0].dt {
			e = errorf(ErrInvalidArgument, "all_reduce_coalesced tensor %d has dtype %v, tensor 0 has %v; coalesce tensors of one dtype", i, bufs[i].dt, bufs[0].dt)
		}
		if e != nil && err == nil {
			err = e
		}
		shapes[i] = shapeString(bufs[i].shape)
		total += len(bufs[i].b)
	}
	var dt dtype
	if len(bufs) > 0 {
		dt = bufs[0].dt
	}
	if err == nil && len(bufs) > 0 {
		err = op.checkFor(dt)
	}
	desc := fmt.Sprintf("all_reduce_coalesced(%v,%s,%v)", dt, strings.Join(shapes, ";"), op)
	return pg.start(ctx, collective{name: "all_reduce_coalesced", desc: desc, invalid: err,
		run: func(ctx context.Context, c *opCtx) error {
			if len(bufs) == 0 || total == 0 {
				return nil
			}
			if len(bufs) == 1 {
				return allReduceBytes(ctx, c, bufs[0].b, dt, op)
			}
			p := getScratch(total)
			defer putScratch(p)
			flat := *p
			off := 0
			for _, b := range bufs {
				off += copy(flat[off:], b.b)
			}
			if err := allReduceBytes(ctx, c, flat, dt, op); err != nil {
				return err
			}
			off = 0
			for _, b := range bufs {
				off += copy(b.b, flat[off:])
			}
			return nil
		}})
}

// allReduceBytes all-reduces b in place.
func allReduceBytes(ctx context.Context, c *opCtx, b []byte, dt dtype, op ReduceOp) error {
	if dt.isHalf() {
		return halfAllReduce(ctx, c, b, dt, op)
	}
	n := c.size()
	if op.kind == KindPremulSum {
		scaleBuf(b, dt, op.factor)
	}
	var finalize func([]byte)
	if op.kind == KindAvg {
		finalize = func(p []byte) { divideBuf(p, dt, n) }
	}
	if n == 1 || len(b) == 0 {
		if finalize != nil {
			finalize(b)
		}
		return nil
	}
	if local, leaders, ok := c.hostViews(); ok {
		return hierAllReduce(ctx, local, leaders, b, dt, op.kind, finalize)
	}
	if len(b) <= maxStageRounds*minStageBlock {
		st, err := c.pg.stageFor(ctx, c)
		if err != nil {
			return err
		}
		if st != nil {
			return st.allReduce(ctx, c, b, dt, &numbers{dt: dt, k: op.kind, finalize: finalize}, c.pg.opts.ringThreshold)
		}
	}
	if len(b) < c.pg.opts.ringThreshold || len(b)/dt.size() < n {
		return recursiveDoubling(ctx, c, b, dt, op.kind, finalize)
	}
	return ringRun(ctx, c, splitEven(b, dt.size(), n), dt, op.kind, 0, 2*(n-1), finalize)
}

// sharedAllReduceOp runs op's all-reduce of b in the shared segment seg
// (sharedAllReduce), with allReduceBytes's scaling before and division
// after.
func sharedAllReduceOp(ctx context.Context, c *opCtx, seg *sharedSeg, off int, b []byte, dt dtype, op ReduceOp) error {
	if op.kind == KindPremulSum {
		scaleBuf(b, dt, op.factor)
	}
	var finalize func([]byte)
	if op.kind == KindAvg {
		n := c.size()
		finalize = func(p []byte) { divideBuf(p, dt, n) }
	}
	return sharedAllReduce(ctx, c, seg, off, b, dt, op.kind, finalize)
}

// recursiveDoubling all-reduces b in log2(p) exchanges of the whole buffer,
// p the largest power of two <= n. The first 2*(n-p) ranks fold in pairs
// first: each even one hands its buffer to the odd one above it, sits out,
// and gets the result back at the end. Each exchange computes a op b on one
// side and b op a on the other, which the reduce kinds make bit-identical.
func recursiveDoubling(ctx context.Context, c *opCtx, b []byte, dt dtype, k ReduceKind, finalize func([]byte)) error {
	n, r := c.size(), c.rank()
	p := 1
	for p*2 <= n {
		p *= 2
	}
	rem := n - p
	const (
		stepFold   = 1
		stepUnfold = 2
		stepFirst  = 3
	)
	tmpP := getScratch(len(b))
	defer putScratch(tmpP)
	tmp := *tmpP
	vr := r - rem
	if r < 2*rem {
		if r%2 == 0 {
			if err := c.send(ctx, r+1, stepFold, b); err != nil {
				return err
			}
			return c.recv(ctx, r+1, stepUnfold, b)
		}
		if err := c.recv(ctx, r-1, stepFold, tmp); err != nil {
			return err
		}
		reduceInto(b, tmp, dt, k)
		vr = r / 2
	}
	step := uint16(stepFirst)
	for mask := 1; mask < p; mask <<= 1 {
		vpeer := vr ^ mask
		peer := vpeer + rem
		if vpeer < rem {
			peer = vpeer*2 + 1
		}
		if err := c.exchange(ctx, peer, b, peer, tmp, step); err != nil {
			return err
		}
		reduceInto(b, tmp, dt, k)
		step++
	}
	if finalize != nil {
		finalize(b)
	}
	if r < 2*rem {
		return c.send(ctx, r-1, stepUnfold, b)
	}
	return nil
}
