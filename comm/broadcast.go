package comm

import (
	"context"
	"fmt"

	"gorgonia.org/tensor"
)

// Broadcast copies root's t into t on every other rank (in place), along a
// binomial tree, pipelined in chunks. Every rank passes a tensor of the same
// dtype and shape.
func (pg *ProcessGroup) Broadcast(ctx context.Context, t *tensor.Dense, root int) Work {
	buf, err := tensorBuffer(t, "broadcast tensor")
	if err == nil {
		err = pg.checkPeer(root, "broadcast root")
	}
	desc := fmt.Sprintf("broadcast(%v,%s,root=%d)", buf.dt, shapeString(buf.shape), root)
	return pg.start(ctx, collective{name: "broadcast", desc: desc, invalid: err,
		run: func(ctx context.Context, c *opCtx) error {
			if len(buf.b) > 0 {
				st, err := c.staging(ctx)
				if err != nil {
					return err
				}
				if st != nil {
					return st.broadcast(ctx, c, buf.b, root)
				}
			}
			return broadcastTree(ctx, c, buf.b, buf.dt, root)
		}})
}

// Reduce reduces t across the group with op into root's t (in place), along a
// binomial tree, or, when the group's ranks share this host, through its
// staging segment. On every other rank t is left unchanged.
func (pg *ProcessGroup) Reduce(ctx context.Context, t *tensor.Dense, root int, op ReduceOp) Work {
	buf, err := tensorBuffer(t, "reduce tensor")
	if err == nil {
		err = op.checkFor(buf.dt)
	}
	if err == nil {
		err = pg.checkPeer(root, "reduce root")
	}
	desc := fmt.Sprintf("reduce(%v,%s,root=%d,%v)", buf.dt, shapeString(buf.shape), root, op)
	return pg.start(ctx, collective{name: "reduce", desc: desc, invalid: err,
		run: func(ctx context.Context, c *opCtx) error {
			if len(buf.b) > 0 && len(buf.b) <= maxStageRounds*minStageBlock {
				st, err := c.staging(ctx)
				if err != nil {
					return err
				}
				if st != nil {
					return st.reduce(ctx, c, buf.b, buf.dt, op, root, c.pg.opts.ringThreshold)
				}
			}
			return reduceTree(ctx, c, buf.b, buf.dt, op, root)
		}})
}
