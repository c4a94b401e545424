package comm

import (
	"context"
	"fmt"

	"gorgonia.org/tensor"
)

// ReduceScatter reduces, for every rank i, the ins[i] of all ranks with op
// into rank i's out. ins has one tensor per rank, each of out's dtype and
// shape; ins are left unchanged. It runs a pipelined ring.
func (pg *ProcessGroup) ReduceScatter(ctx context.Context, out *tensor.Dense, ins []*tensor.Dense, op ReduceOp) Work {
	dst, err := tensorBuffer(out, "reduce_scatter output")
	if err == nil {
		err = op.checkFor(dst.dt)
	}
	var blocks [][]byte
	if err == nil {
		blocks, err = pg.inputBlocks(ins, dst, "reduce_scatter")
	}
	desc := fmt.Sprintf("reduce_scatter(%v,%s,%v)", dst.dt, shapeString(dst.shape), op)
	return pg.start(ctx, collective{name: "reduce_scatter", desc: desc, invalid: err,
		run: func(ctx context.Context, c *opCtx) error {
			return reduceScatterBlocks(ctx, c, dst.b, blocks, dst.dt, op)
		}})
}

// ReduceScatterTensor is ReduceScatter with the inputs concatenated along
// dimension 0 in one tensor: in holds Size() times out's elements, the i-th
// block going to rank i. in is left unchanged.
func (pg *ProcessGroup) ReduceScatterTensor(ctx context.Context, out, in *tensor.Dense, op ReduceOp) Work {
	dst, err := tensorBuffer(out, "reduce_scatter_tensor output")
	var src buffer
	if err == nil {
		src, err = tensorBuffer(in, "reduce_scatter_tensor input")
	}
	if err == nil {
		err = op.checkFor(dst.dt)
	}
	if err == nil {
		err = pg.checkConcat(src, dst, "reduce_scatter_tensor input", "output")
	}
	desc := fmt.Sprintf("reduce_scatter_tensor(%v,%s,%v)", dst.dt, shapeString(dst.shape), op)
	return pg.start(ctx, collective{name: "reduce_scatter_tensor", desc: desc, invalid: err,
		run: func(ctx context.Context, c *opCtx) error {
			return reduceScatterBlocks(ctx, c, dst.b, splitBlocks(src.b, len(dst.b), c.size()), dst.dt, op)
		}})
}

// reduceScatterBlocks reduces block r of every rank into out: through the
// group's staging segment on one host, else with the inputs copied once
// into pooled scratch, which the ring then reduces in place.
func reduceScatterBlocks(ctx context.Context, c *opCtx, out []byte, blocks [][]byte, dt dtype, op ReduceOp) error {
	if len(out) > 0 {
		st, err := c.staging(ctx)
		if err != nil {
			return err
		}
		if st != nil {
			return st.reduceScatter(ctx, c, out, blocks, dt, op)
		}
	}
	if dt.isHalf() {
		return halfReduceScatter(ctx, c, blocks, out, dt, op)
	}
	n, r := c.size(), c.rank()
	size := len(out)
	p := getScratch(size * n)
	defer putScratch(p)
	work := splitBlocks(*p, size, n)
	for i, b := range blocks {
		copy(work[i], b)
	}
	if op.kind == KindPremulSum {
		scaleBuf(*p, dt, op.factor)
	}
	var finalize func([]byte)
	if op.kind == KindAvg {
		finalize = func(b []byte) { divideBuf(b, dt, n) }
	}
	if n == 1 || size == 0 {
		if finalize != nil {
			finalize(work[r])
		}
	} else if err := ringRun(ctx, c, work, dt, op.kind, 0, n-1, finalize); err != nil {
		return err
	}
	copy(out, work[r])
	return nil
}
