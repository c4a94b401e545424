package comm

import (
	"context"
	"fmt"

	"gorgonia.org/tensor"
)

// AllGather gathers every rank's in into outs on every rank: outs[i] receives
// rank i's in. outs has one tensor per rank, each of in's dtype and shape;
// every rank's in has the same dtype and shape. outs[Rank()] may be in itself.
// It runs a pipelined ring.
func (pg *ProcessGroup) AllGather(ctx context.Context, outs []*tensor.Dense, in *tensor.Dense) Work {
	src, err := tensorBuffer(in, "all_gather input")
	var blocks [][]byte
	if err == nil {
		blocks, err = pg.outputBlocks(outs, src, "all_gather")
	}
	desc := fmt.Sprintf("all_gather(%v,%s)", src.dt, shapeString(src.shape))
	return pg.start(ctx, collective{name: "all_gather", desc: desc, invalid: err,
		run: func(ctx context.Context, c *opCtx) error {
			return allGatherBlocks(ctx, c, blocks, src)
		}})
}

// AllGatherIntoTensor gathers every rank's in into out on every rank, rank
// i's in at position i of the concatenation along dimension 0: out holds
// Size() times in's elements, of in's dtype.
func (pg *ProcessGroup) AllGatherIntoTensor(ctx context.Context, out, in *tensor.Dense) Work {
	src, err := tensorBuffer(in, "all_gather_into_tensor input")
	var dst buffer
	if err == nil {
		dst, err = tensorBuffer(out, "all_gather_into_tensor output")
	}
	if err == nil {
		err = pg.checkConcat(dst, src, "all_gather_into_tensor output", "input")
	}
	desc := fmt.Sprintf("all_gather_into_tensor(%v,%s)", src.dt, shapeString(src.shape))
	return pg.start(ctx, collective{name: "all_gather_into_tensor", desc: desc, invalid: err,
		run: func(ctx context.Context, c *opCtx) error {
			return allGatherBlocks(ctx, c, splitBlocks(dst.b, len(src.b), c.size()), src)
		}})
}

// allGatherBlocks copies every rank's src into blocks[rank] on every rank:
// through the group's staging segment on one host, else along a pipelined
// ring.
func allGatherBlocks(ctx context.Context, c *opCtx, blocks [][]byte, src buffer) error {
	if len(src.b) > 0 {
		st, err := c.staging(ctx)
		if err != nil {
			return err
		}
		if st != nil {
			return st.allGather(ctx, c, blocks, src.b)
		}
	}
	copy(blocks[c.rank()], src.b)
	return ringRun(ctx, c, blocks, src.dt, KindSum, c.size()-1, 2*(c.size()-1), nil)
}

// Gather sends every rank's in to root, into outs[i] for rank i. outs is used
// on root only (pass nil elsewhere): one tensor per rank of in's dtype and
// shape. Every rank's in has the same dtype and shape. On a group whose ranks
// share this host it goes through the group's staging segment.
func (pg *ProcessGroup) Gather(ctx context.Context, outs []*tensor.Dense, in *tensor.Dense, root int) Work {
	src, err := tensorBuffer(in, "gather input")
	if err == nil {
		err = pg.checkPeer(root, "gather root")
	}
	var blocks [][]byte
	if err == nil && pg.rank == root {
		blocks, err = pg.outputBlocks(outs, src, "gather")
	}
	desc := fmt.Sprintf("gather(%v,%s,root=%d)", src.dt, shapeString(src.shape), root)
	return pg.start(ctx, collective{name: "gather", desc: desc, invalid: err,
		run: func(ctx context.Context, c *opCtx) error {
			if len(src.b) > 0 {
				st, err := c.staging(ctx)
				if err != nil {
					return err
				}
				if st != nil {
					return st.gather(ctx, c, blocks, src.b, root)
				}
			}
			if c.rank() != root {
				if len(src.b) == 0 {
					return nil
				}
				return c.send(ctx, root, 1, src.b)
			}
			copy(blocks[root], src.b)
			if len(src.b) == 0 {
				return nil
			}
			for i := range c.size() {
				if i != root {
					if err := c.recv(ctx, i, 1, blocks[i]); err != nil {
						return err
					}
				}
			}
			return nil
		}})
}

// Scatter sends root's ins[i] to rank i's out. ins is used on root only (pass
// nil elsewhere): one tensor per rank of out's dtype and shape. Every rank's
// out has the same dtype and shape.
func (pg *ProcessGroup) Scatter(ctx context.Context, out *tensor.Dense, ins []*tensor.Dense, root int) Work {
	dst, err := tensorBuffer(out, "scatter output")
	if err == nil {
		err = pg.checkPeer(root, "scatter root")
	}
	var blocks [][]byte
	if err == nil && pg.rank == root {
		blocks, err = pg.inputBlocks(ins, dst, "scatter")
	}
	desc := fmt.Sprintf("scatter(%v,%s,root=%d)", dst.dt, shapeString(dst.shape), root)
	return pg.start(ctx, collective{name: "scatter", desc: desc, invalid: err,
		run: func(ctx context.Context, c *opCtx) error {
			// Not staged, even on one host: with root copying every
			// rank's part into the staging segment alone, 16 MiB a rank
			// among four goroutine ranks took 17 ms against 13 through
			// the transport's rings (BenchmarkStagedCollectives with a
			// staged scatter, 2026-11-25, two runs).
			if len(dst.b) == 0 {
				return nil
			}
			if c.rank() != root {
				return c.recv(ctx, root, 1, dst.b)
			}
			return withSender(ctx, c, c.size(), func(ctx context.Context, s *sender) error {
				for i := range c.size() {
					if i != root {
						s.push(i, 1, blocks[i])
					}
				}
				copy(dst.b, blocks[root])
				return nil
			})
		}})
}

// outputBlocks checks that outs holds one tensor per rank shaped like ref and
// returns their memory.
func (pg *ProcessGroup) outputBlocks(outs []*tensor.Dense, ref buffer, op string) ([][]byte, error) {
	return pg.blocksLike(outs, ref, op+" output")
}

func (pg *ProcessGroup) inputBlocks(ins []*tensor.Dense, ref buffer, op string) ([][]byte, error) {
	return pg.blocksLike(ins, ref, op+" input")
}

func (pg *ProcessGroup) blocksLike(ts []*tensor.Dense, ref buffer, what string) ([][]byte, error) {
	if len(ts) != len(pg.members) {
		return nil, errorf(ErrInvalidArgument, "%s list has %d tensors; the group has %d ranks", what, len(ts), len(pg.members))
	}
	blocks := make([][]byte, len(ts))
	for i, t := range ts {
		b, err := tensorBuffer(t, fmt.Sprintf("%s %d", what, i))
		if err != nil {
			return nil, err
		}
		if b.dt != ref.dt || !sameShape(b.shape, ref.shape) {
			return nil, errorf(ErrInvalidArgument, "%s %d is %v%s; it must be %v%s", what, i, b.dt, shapeString(b.shape), ref.dt, shapeString(ref.shape))
		}
		blocks[i] = b.b
	}
	return blocks, nil
}

// checkConcat checks that big holds Size() times small's elements of small's
// dtype.
func (pg *ProcessGroup) checkConcat(big, small buffer, bigWhat, smallWhat string) error {
	if big.dt != small.dt {
		return errorf(ErrInvalidArgument, "%s has dtype %v but the %s has %v", bigWhat, big.dt, smallWhat, small.dt)
	}
	if len(big.b) != len(small.b)*len(pg.members) {
		return errorf(ErrInvalidArgument, "%s %s has %d elements; it must have %d (%d ranks x %s %s)", bigWhat, shapeString(big.shape),
			big.elems(), small.elems()*len(pg.members), len(pg.members), smallWhat, shapeString(small.shape))
	}
	return nil
}

// splitBlocks cuts b into n blocks of size bytes each.
func splitBlocks(b []byte, size, n int) [][]byte {
	blocks := make([][]byte, n)
	for i := range n {
		blocks[i] = b[i*size : (i+1)*size]
	}
	return blocks
}
