package comm

import "context"

// Reductions of 16-bit floats (float16, bfloat16).
//
// Every rank's values are widened to float32 (exactly), combined in float32
// in rank order, r0 op r1 op ... op r(n-1) (PremulSum multiplies each by its
// factor in float32 first; Avg divides the float32 total by n), and the
// float32 result is rounded to 16 bits once, to nearest, ties to even. No
// partial result is ever rounded to 16 bits, and only 16-bit values travel:
//
//   - reduce-scatter (and the first half of a large all-reduce): each rank
//     sends every other rank that rank's block of its own input, directly,
//     in chunks; the owner of a block folds the n contributions, chunk by
//     chunk, in a float32 scratch, and rounds. Each rank sends (n-1)/n of its
//     buffer, as a ring reduce-scatter does, in one round instead of n-1.
//   - all-reduce at least WithRingThreshold bytes: that reduce-scatter, then
//     the ring all-gather of the rounded blocks.
//   - smaller all-reduces: every rank sends its whole buffer to every other
//     and folds all n itself (one round; every rank computes the same bits).
//   - reduce: every rank sends its buffer to the root, which folds.
//
// On one host, all-reduce and reduce-scatter go through the group's
// staging segment instead (stage.go), folding the same way.
//
// So all-reduce, reduce and reduce-scatter give bit-identical results for
// the same inputs, whatever the buffer size, chunk size, algorithm
// threshold or staging, and every rank ends with the same bits.
//
// gloo differs: its float16 type rounds after every arithmetic operation,
// so its ring rounds each partial sum to 16 bits at every hop (n-1 roundings
// for n ranks) and its result depends on the ring's order. PyTorch's
// fp16_compress_hook over gloo inherits that; the hooks here
// (ddp.FP16CompressHook) round once and are at least as accurate.

// stepHalf tags the direct messages of a 16-bit reduction; the ring
// all-gather that follows uses stepRing.
const stepHalf = 3

// halfAllReduce all-reduces the 16-bit buffer b in place.
func halfAllReduce(ctx context.Context, c *opCtx, b []byte, dt dtype, op ReduceOp) error {
	n, r := c.size(), c.rank()
	if len(b) == 0 {
		return nil
	}
	if n > 1 {
		st, err := c.staging(ctx)
		if err != nil {
			return err
		}
		if st != nil {
			f := newHalfFold(st.block, dt, op, n)
			defer f.free()
			return st.allReduce(ctx, c, b, dt, halves{f}, c.pg.opts.ringThreshold)
		}
	}
	if len(b) < c.pg.opts.ringThreshold || len(b)/dt.size() < n {
		// send a snapshot: b is rewritten while the sends may be running
		p := getScratch(len(b))
		defer putScratch(p)
		src := *p
		copy(src, b)
		blocks := make([][]byte, n)
		for i := range blocks {
			blocks[i] = src
		}
		return halfReduceScatter(ctx, c, blocks, b, dt, op)
	}
	segs := splitEven(b, dt.size(), n)
	// segs[r] is never sent during the reduce-scatter, so it can take the
	// result in place
	if err := halfReduceScatter(ctx, c, segs, segs[r], dt, op); err != nil {
		return err
	}
	return ringRun(ctx, c, segs, dt, KindSum, n-1, 2*(n-1), nil)
}

// halfReduceScatter folds, into out, block r of every rank: blocks[p] is this
// rank's contribution to rank p's block (every rank agrees on the lengths),
// and out (len(blocks[r]) bytes) may be blocks[r] itself but no other block.
func halfReduceScatter(ctx context.Context, c *opCtx, blocks [][]byte, out []byte, dt dtype, op ReduceOp) error {
	n, r := c.size(), c.rank()
	own := blocks[r]
	chunk := c.chunkBytes(dt)
	jobs, most := 0, 0
	for p, b := range blocks {
		if p != r {
			jobs += numChunks(b, chunk)
		}
		most = max(most, numChunks(b, chunk))
	}
	f := newHalfFold(min(chunk, len(own)), dt, op, n)
	defer f.free()
	var slotsP *[]byte
	slot := min(chunk, len(own))
	if n > 1 {
		slotsP = getScratch((n - 1) * slot)
		defer putScratch(slotsP)
	}
	return withSender(ctx, c, jobs, func(ctx context.Context, s *sender) error {
		// chunk i goes to ranks r+1, r+2, ... in turn, and chunk i of the own
		// block comes from r-1, r-2, ... in turn: every rank sends and
		// receives in the same (chunk, distance) order, so the pipeline
		// cannot deadlock whatever the transport buffers.
		for i := range most {
			for j := 1; j < n; j++ {
				p := (r + j) % n
				if i < numChunks(blocks[p], chunk) {
					s.push(p, stepHalf, chunkOf(blocks[p], i, chunk))
				}
			}
		}
		parts := make([][]byte, n)
		for i := range numChunks(own, chunk) {
			mine := chunkOf(own, i, chunk)
			for j := 1; j < n; j++ {
				q := (r - j + n) % n
				in := (*slotsP)[(j-1)*slot : (j-1)*slot+len(mine)]
				if err := c.recv(ctx, q, stepHalf, in); err != nil {
					return err
				}
				parts[q] = in
			}
			parts[r] = mine
			f.fold(chunkOf(out, i, chunk), parts)
		}
		return nil
	})
}

// halfReduceRoot folds every rank's b into root's b; other ranks' b are left
// unchanged.
func halfReduceRoot(ctx context.Context, c *opCtx, b []byte, dt dtype, op ReduceOp, root int) error {
	n, r := c.size(), c.rank()
	if len(b) == 0 {
		return nil
	}
	chunk := c.chunkBytes(dt)
	nc := numChunks(b, chunk)
	if r != root {
		return withSender(ctx, c, nc, func(ctx context.Context, s *sender) error {
			for i := range nc {
				s.push(root, stepHalf, chunkOf(b, i, chunk))
			}
			return nil
		})
	}
	slot := min(chunk, len(b))
	f := newHalfFold(slot, dt, op, n)
	defer f.free()
	slotsP := getScratch(n * slot)
	defer putScratch(slotsP)
	parts := make([][]byte, n)
	for i := range nc {
		mine := chunkOf(b, i, chunk)
		for q := range n {
			if q == r {
				parts[q] = mine
				continue
			}
			in := (*slotsP)[q*slot : q*slot+len(mine)]
			if err := c.recv(ctx, q, stepHalf, in); err != nil {
				return err
			}
			parts[q] = in
		}
		f.fold(mine, parts)
	}
	return nil
}

// halfFold combines chunks of 16-bit values in float32 scratch, foldBlock
// elements at a time, so that the float32 partials stay in the first-level
// cache while every rank's values are added to them.
type halfFold struct {
	dt       dtype
	op       ReduceOp
	n        int // the group's size, Avg's divisor
	accP     *[]byte
	tmpP     *[]byte
	acc, tmp []float32
}

const foldBlock = 2048

// newHalfFold prepares a fold; chunk, the largest chunk in bytes, only
// bounds the scratch.
func newHalfFold(chunk int, dt dtype, op ReduceOp, n int) *halfFold {
	elems := min(chunk/dt.size(), foldBlock)
	f := &halfFold{dt: dt, op: op, n: n, accP: getScratch(4 * elems), tmpP: getScratch(4 * elems)}
	f.acc, f.tmp = typed[float32](*f.accP), typed[float32](*f.tmpP)
	return f
}

func (f *halfFold) free() {
	putScratch(f.accP)
	putScratch(f.tmpP)
}

// fold sets out to the rounded op-reduction of parts (in order), each of
// len(out) bytes; out may be one of the parts.
func (f *halfFold) fold(out []byte, parts [][]byte) {
	es := f.dt.size()
	step := len(f.acc) * es
	for lo := 0; lo < len(out); lo += step {
		hi := min(lo+step, len(out))
		f.foldBlock(out[lo:hi], parts, lo, hi)
	}
}

// foldBlock folds bytes [lo, hi) of every part into out.
func (f *halfFold) foldBlock(out []byte, parts [][]byte, lo, hi int) {
	m := len(out) / f.dt.size()
	acc, tmp := f.acc[:m], f.tmp[:m]
	premul := f.op.kind == KindPremulSum
	factor := float32(f.op.factor)
	widenHalf(acc, parts[0][lo:hi], f.dt)
	if premul {
		mulAll(acc, factor)
	}
	for _, p := range parts[1:] {
		if k := f.op.kind; k == KindSum || k == KindAvg {
			addWidenHalf(acc, p[lo:hi], f.dt) // one fused pass, the same additions
			continue
		}
		widenHalf(tmp, p[lo:hi], f.dt)
		if premul {
			mulAll(tmp, factor)
		}
		reduceInto(asBytes(acc), asBytes(tmp), dtFloat32, f.op.kind)
	}
	if f.op.kind == KindAvg {
		divAll(acc, float32(f.n))
	}
	narrowHalf(out, acc, f.dt)
}
