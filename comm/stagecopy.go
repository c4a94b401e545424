package comm

import "context"

// Staged broadcast, gather, all-gather and reduce-scatter.
//
// The same staging segment as the all-reduce's (stage.go) carries these on
// a group whose ranks all run on this host: a rank copies what it
// contributes into its buffer, and after a barrier the others read it
// there. The data goes through in rounds of one buffer: round j+1 is
// copied in while round j is read, and with three buffers a rank may fill
// round j+1's once everyone passed the barrier after round j, by which
// time every read of round j-2, the buffer's last use, is done: one
// barrier a round.

// rounds runs put and take over n rounds: put(j, buf) fills this rank's
// buffer for round j (or leaves it), take(j, i) reads round j out of
// buffer i of the ranks that filled it.
func (s *stage) rounds(ctx context.Context, c *opCtx, n int, put func(j int, buf []byte), take func(j, i int)) error {
	r := c.rank()
	seq := s.extend(c.seq)
	if err := s.begin(ctx, c, s.spin, seq, 1<<stageBuffers-1); err != nil {
		return err
	}
	defer s.end(r)
	put(0, s.buffer(r, 0))
	if err := s.barrier(ctx, c, s.spin, seq, 1); err != nil {
		return err
	}
	for j := range n {
		if j+1 < n {
			put(j+1, s.buffer(r, (j+1)%stageBuffers))
		}
		take(j, j%stageBuffers)
		if j+1 < n {
			if err := s.barrier(ctx, c, s.spin, seq, j+2); err != nil {
				return err
			}
		}
	}
	return nil
}

// roundsOf is how many rounds of size bytes take to move total bytes (at
// least one).
func roundsOf(total, size int) int { return max(1, (total+size-1)/size) }

// piece returns round j's piece of b, in rounds of size bytes.
func piece(b []byte, j, size int) []byte { return b[min(j*size, len(b)):min((j+1)*size, len(b))] }

// broadcast copies root's b into b on every rank.
func (s *stage) broadcast(ctx context.Context, c *opCtx, b []byte, root int) error {
	r := c.rank()
	return s.rounds(ctx, c, roundsOf(len(b), s.block),
		func(j int, buf []byte) {
			if r == root {
				copyCached(buf, piece(b, j, s.block))
			}
		},
		func(j, i int) {
			if r != root {
				p := piece(b, j, s.block)
				copyCached(p, s.buffer(root, i)[:len(p)])
			}
		})
}

// gather copies every rank's src into blocks[rank] on root (blocks is
// root's alone).
func (s *stage) gather(ctx context.Context, c *opCtx, blocks [][]byte, src []byte, root int) error {
	n, r := c.size(), c.rank()
	if r == root {
		copy(blocks[r], src)
	}
	return s.rounds(ctx, c, roundsOf(len(src), s.block),
		func(j int, buf []byte) {
			if r != root {
				copyCached(buf, piece(src, j, s.block))
			}
		},
		func(j, i int) {
			if r != root {
				return
			}
			for p := range n {
				if p != r {
					dst := piece(blocks[p], j, s.block)
					copyCached(dst, s.buffer(p, i)[:len(dst)])
				}
			}
		})
}

// allGather copies every rank's src into blocks[rank] on every rank (and
// its own, unless blocks[r] is src already).
func (s *stage) allGather(ctx context.Context, c *opCtx, blocks [][]byte, src []byte) error {
	n, r := c.size(), c.rank()
	copy(blocks[r], src)
	return s.rounds(ctx, c, roundsOf(len(src), s.block),
		func(j int, buf []byte) { copyCached(buf, piece(src, j, s.block)) },
		func(j, i int) {
			for p := range n {
				if p != r {
					dst := piece(blocks[p], j, s.block)
					copyCached(dst, s.buffer(p, i)[:len(dst)])
				}
			}
		})
}

// reduceScatter reduces block r of every rank's blocks into out (each
// block len(out) bytes): plain dtypes with their inputs scaled first for a
// premultiplied sum and the result divided for an average, 16-bit floats
// in float32, rounded once (halfFold). A round moves a slot of every
// block: rank r reads slot r of each peer's buffer and combines it with
// its own block's, in rank order.
func (s *stage) reduceScatter(ctx context.Context, c *opCtx, out []byte, blocks [][]byte, dt dtype, op ReduceOp) error {
	n, r, es := c.size(), c.rank(), dt.size()
	slot := max(es, s.block/n/es*es)
	scale := func(b []byte) {
		if op.kind == KindPremulSum && !dt.isHalf() {
			scaleBuf(b, dt, op.factor)
		}
	}
	nums := &numbers{dt: dt, k: op.kind}
	if op.kind == KindAvg {
		nums.finalize = func(b []byte) { divideBuf(b, dt, n) }
	}
	var comb combiner = nums
	if dt.isHalf() {
		f := newHalfFold(slot, dt, op, n)
		defer f.free()
		comb = halves{f}
	}
	parts := make([][]byte, n)
	return s.rounds(ctx, c, roundsOf(len(out), slot),
		func(j int, buf []byte) {
			for p := range n {
				if p != r {
					in := piece(blocks[p], j, slot)
					staged := buf[p*slot : p*slot+len(in)]
					copy(staged, in)
					scale(staged)
				}
			}
		},
		func(j, i int) {
			mine := piece(out, j, slot)
			for p := range n {
				parts[p] = s.buffer(p, i)[r*slot : r*slot+len(mine)]
			}
			if dt.isHalf() {
				parts[r] = piece(blocks[r], j, slot)
				comb.whole(mine, parts)
				return
			}
			// The own block's piece is copied, and scaled there: the
			// input stays as it was.
			copy(mine, piece(blocks[r], j, slot))
			scale(mine)
			parts[r] = mine
			comb.share(mine, parts, r)
		})
}
