package dist

import (
	"context"
	"fmt"

	G "gorgonia.org/gorgonia"
	"gorgonia.org/tensor"

	"github.com/tandemml/tandem/comm"
)

// DoContext runs the collective on this rank and returns its output. The
// executor in package graph calls it with the run's context; every wait is
// bounded by ctx and by the group's default timeout. Inputs are only read;
// the output is written into prealloc when it fits, else into a fresh buffer.
func (op *collective) DoContext(ctx context.Context, prealloc G.Value, inputs ...G.Value) (G.Value, error) {
	if len(inputs) != op.Arity() {
		return nil, fmt.Errorf("%v: got %d inputs, want %d: %w", op, len(inputs), op.Arity(), comm.ErrInvalidArgument)
	}
	data := make([]any, op.nData)
	for i := range data {
		buf, dt, err := flatOf(inputs[i])
		if err != nil {
			return nil, fmt.Errorf("%v: input %d: %v: %w", op, i, err, comm.ErrInvalidArgument)
		}
		if dt != op.dt {
			return nil, fmt.Errorf("%v: input %d has dtype %v, the node was built for %v: %w", op, i, dt, op.dt, comm.ErrInvalidArgument)
		}
		data[i] = buf
	}
	out := reuse(prealloc, op.dt, op.outShape.TotalSize())
	if err := op.run(ctx, out, data); err != nil {
		return nil, fmt.Errorf("%v: %w", op, err)
	}
	if op.scale != 1 {
		scaleFlat(out, op.scale)
	}
	return result(out, op.outType, op.outShape), nil
}

// run computes the collective into out from the flat data inputs.
func (op *collective) run(ctx context.Context, out any, data []any) error {
	pg := op.pg
	w := pg.Size()
	n := op.block.TotalSize()
	wait := func(work comm.Work) error { return work.Wait(ctx) }
	switch op.kind {
	case kindAllReduce:
		copyFlat(out, 0, data[0])
		return wait(pg.AllReduce(ctx, dense(out, op.block), op.red))

	case kindBroadcast:
		copyFlat(out, 0, data[0])
		return wait(pg.Broadcast(ctx, dense(out, op.block), op.root))

	case kindReduce:
		copyFlat(out, 0, data[0])
		if err := wait(pg.Reduce(ctx, dense(out, op.block), op.root, op.red)); err != nil {
			return err
		}
		if pg.Rank() != op.root {
			zeroFlat(out) // what a rank does not receive is zero
		}
		return nil

	case kindAllGather, kindAllGatherIntoTensor:
		return wait(pg.AllGatherIntoTensor(ctx, dense(out, tensor.Shape{w * n}), dense(data[0], tensor.Shape{n})))

	case kindGather:
		zeroFlat(out)
		var outs []*tensor.Dense
		if pg.Rank() == op.root {
			outs = blocks(out, w, n)
		}
		return wait(pg.Gather(ctx, outs, dense(data[0], tensor.Shape{n}), op.root))

	case kindScatter:
		var ins []*tensor.Dense
		if pg.Rank() == op.root {
			ins = op.perRank(data, w, n)
		}
		return wait(pg.Scatter(ctx, dense(out, tensor.Shape{n}), ins, op.root))

	case kindReduceScatter, kindReduceScatterTensor:
		return wait(pg.ReduceScatterTensor(ctx, dense(out, tensor.Shape{n}), op.packed(data, w, n), op.red))

	case kindAllToAll:
		return wait(pg.AllToAllSingle(ctx, dense(out, tensor.Shape{w * n}), op.packed(data, w, n), nil, nil))

	case kindAllToAllSingle:
		in := dense(data[0], op.block)
		return wait(pg.AllToAllSingle(ctx, dense(out, op.outShape), in, op.outSplits, op.inSplits))

	case kindAllReduceGrad, kindReduceGrad:
		// Every rank needs every rank's input to weigh its own share, and the
		// upstream gradient: summed over ranks for all_reduce, the root's for
		// reduce (the only output that reaches the objective).
		xs := newFlat(op.dt, w*n)
		if err := wait(pg.AllGatherIntoTensor(ctx, dense(xs, tensor.Shape{w * n}), dense(data[0], tensor.Shape{n}))); err != nil {
			return err
		}
		copyFlat(out, 0, data[1])
		var work comm.Work
		if op.kind == kindAllReduceGrad {
			work = pg.AllReduce(ctx, dense(out, tensor.Shape{n}), comm.Sum)
		} else {
			work = pg.Broadcast(ctx, dense(out, tensor.Shape{n}), op.root)
		}
		if err := wait(work); err != nil {
			return err
		}
		return mulWeights(out, xs, w, n, pg.Rank(), op.red)

	case kindReduceScatterGrad:
		// Rank r owns output block r, the reduction over q of rank q's block
		// r. The first all-to-all brings every rank's block r to rank r,
		// which weighs the upstream gradient for each contributor; the second
		// sends each contributor its share back.
		got := newFlat(op.dt, w*n)
		if err := wait(pg.AllToAllSingle(ctx, dense(got, tensor.Shape{w * n}), op.packed(data[:op.nData-1], w, n), nil, nil)); err != nil {
			return err
		}
		shares := newFlat(op.dt, w*n)
		if err := shareGrads(shares, got, data[op.nData-1], w, n, op.red); err != nil {
			return err
		}
		return wait(pg.AllToAllSingle(ctx, dense(out, tensor.Shape{w * n}), dense(shares, tensor.Shape{w * n}), nil, nil))
	}
	return fmt.Errorf("unknown collective kind %d: %w", op.kind, comm.ErrInvalidArgument)
}

// blocks cuts buf into w tensors of n elements each, sharing its memory.
func blocks(buf any, w, n int) []*tensor.Dense {
	ts := make([]*tensor.Dense, w)
	for i := range ts {
		ts[i] = dense(subFlat(buf, i*n, (i+1)*n), tensor.Shape{n})
	}
	return ts
}

// perRank returns the per-rank input blocks as tensors: the list children
// themselves, or views of the packed child.
func (op *collective) perRank(data []any, w, n int) []*tensor.Dense {
	if !op.list {
		return blocks(data[0], w, n)
	}
	ts := make([]*tensor.Dense, w)
	for i := range ts {
		ts[i] = dense(data[i], tensor.Shape{n})
	}
	return ts
}

// packed returns the per-rank input blocks as one contiguous tensor of w*n
// elements: the packed child itself, or a copy of the list children.
func (op *collective) packed(data []any, w, n int) *tensor.Dense {
	if !op.list {
		return dense(data[0], tensor.Shape{w * n})
	}
	buf := newFlat(op.dt, w*n)
	for i := 0; i < w; i++ {
		copyFlat(buf, i*n, data[i])
	}
	return dense(buf, tensor.Shape{w * n})
}
