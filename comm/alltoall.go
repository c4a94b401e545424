package comm

import (
	"context"
	"fmt"

	"gorgonia.org/tensor"
)

const stepAllToAll = 1

// AllToAll sends ins[j] to rank j, which receives it into its outs[i] (i this
// rank): a transpose of data across ranks. Shapes may differ from pair to
// pair, but each outs[i] must have exactly the size of what rank i sends here;
// all tensors have one dtype. It runs a pairwise exchange: at step s each rank
// sends to rank+s and receives from rank-s, concurrently.
func (pg *ProcessGroup) AllToAll(ctx context.Context, outs, ins []*tensor.Dense) Work {
	var err error
	var dt dtype
	sendB := make([][]byte, len(ins))
	recvB := make([][]byte, len(outs))
	check := func(ts []*tensor.Dense, into [][]byte, what string) {
		if err == nil && len(ts) != len(pg.members) {
			err = errorf(ErrInvalidArgument, "all_to_all %s list has %d tensors; the group has %d ranks", what, len(ts), len(pg.members))
		}
		for i := 0; err == nil && i < len(ts); i++ {
			var b buffer
			b, err = tensorBuffer(ts[i], fmt.Sprintf("all_to_all %s %d", what, i))
			if err == nil && dt != dtInvalid && b.dt != dt {
				err = errorf(ErrInvalidArgument, "all_to_all %s %d has dtype %v; the others have %v", what, i, b.dt, dt)
			}
			if err == nil {
				dt = b.dt
				into[i] = b.b
			}
		}
	}
	check(ins, sendB, "input")
	check(outs, recvB, "output")
	if err == nil && pg.rank >= 0 && len(sendB[pg.rank]) != len(recvB[pg.rank]) {
		err = errorf(ErrInvalidArgument, "all_to_all input %d (this rank's own block) has %d bytes but output %d has %d", pg.rank, len(sendB[pg.rank]), pg.rank, len(recvB[pg.rank]))
	}
	desc := fmt.Sprintf("all_to_all(%v)", dt)
	return pg.start(ctx, collective{name: "all_to_all", desc: desc, invalid: err,
		run: func(ctx context.Context, c *opCtx) error { return pairwise(ctx, c, recvB, sendB) }})
}

// AllToAllSingle is AllToAll over one input and one output tensor split along
// dimension 0: inSplits[j] rows of in go to rank j, and outSplits[i] rows of
// out come from rank i. A nil split means equal parts (dimension 0 divided by
// Size()). in and out have the same dtype and the same sizes beyond
// dimension 0.
func (pg *ProcessGroup) AllToAllSingle(ctx context.Context, out, in *tensor.Dense, outSplits, inSplits []int) Work {
	src, err := tensorBuffer(in, "all_to_all_single input")
	var dst buffer
	if err == nil {
		dst, err = tensorBuffer(out, "all_to_all_single output")
	}
	var sendB, recvB [][]byte
	var row string
	if err == nil {
		if src.dt != dst.dt {
			err = errorf(ErrInvalidArgument, "all_to_all_single output has dtype %v but input has %v", dst.dt, src.dt)
		}
	}
	if err == nil {
		row = shapeString(tail(src.shape))
		if !sameShape(tail(src.shape), tail(dst.shape)) {
			err = errorf(ErrInvalidArgument, "all_to_all_single input %s and output %s differ beyond dimension 0", shapeString(src.shape), shapeString(dst.shape))
		}
	}
	if err == nil {
		sendB, err = pg.splitRows(src, inSplits, "input")
	}
	if err == nil {
		recvB, err = pg.splitRows(dst, outSplits, "output")
	}
	if err == nil && len(sendB[pg.rank]) != len(recvB[pg.rank]) {
		err = errorf(ErrInvalidArgument, "all_to_all_single sends %d bytes to itself but expects %d from itself; inSplits[%d] must equal outSplits[%d]",
			len(sendB[pg.rank]), len(recvB[pg.rank]), pg.rank, pg.rank)
	}
	desc := fmt.Sprintf("all_to_all_single(%v,rows of %s)", src.dt, row)
	return pg.start(ctx, collective{name: "all_to_all_single", desc: desc, invalid: err,
		run: func(ctx context.Context, c *opCtx) error { return pairwise(ctx, c, recvB, sendB) }})
}

func tail(shape []int) []int {
	if len(shape) == 0 {
		return nil
	}
	return shape[1:]
}

// splitRows cuts b along dimension 0 by splits (nil: equal parts).
func (pg *ProcessGroup) splitRows(b buffer, splits []int, what string) ([][]byte, error) {
	n := len(pg.members)
	if len(b.shape) == 0 {
		return nil, errorf(ErrInvalidArgument, "all_to_all_single %s is a scalar; it needs a dimension 0 to split", what)
	}
	rows := b.shape[0]
	rowBytes := 0
	if rows > 0 {
		rowBytes = len(b.b) / rows
	}
	if splits == nil {
		if rows%n != 0 {
			return nil, errorf(ErrInvalidArgument, "all_to_all_single %s has %d rows, not divisible by %d ranks; pass explicit splits", what, rows, n)
		}
		splits = make([]int, n)
		for i := range splits {
			splits[i] = rows / n
		}
	}
	if len(splits) != n {
		return nil, errorf(ErrInvalidArgument, "all_to_all_single %s splits %v has %d entries; the group has %d ranks", what, splits, len(splits), n)
	}
	out := make([][]byte, n)
	off := 0
	for i, s := range splits {
		if s < 0 {
			return nil, errorf(ErrInvalidArgument, "all_to_all_single %s split %d is negative (%d)", what, i, s)
		}
		if off+s > rows {
			off += s
			break
		}
		out[i] = b.b[off*rowBytes : (off+s)*rowBytes]
		off += s
	}
	if off != rows {
		return nil, errorf(ErrInvalidArgument, "all_to_all_single %s splits %v sum to %d rows; the tensor has %d", what, splits, sum(splits), rows)
	}
	return out, nil
}

func sum(s []int) int {
	t := 0
	for _, v := range s {
		t += v
	}
	return t
}

// pairwise sends sendB[j] to rank j and receives recvB[i] from rank i. Sends
// run from a sender goroutine, in step order, while this goroutine receives.
// Empty blocks travel as empty messages, so that a size disagreement between
// a pair is caught by the receive.
func pairwise(ctx context.Context, c *opCtx, recvB, sendB [][]byte) error {
	n, r := c.size(), c.rank()
	copy(recvB[r], sendB[r])
	if n == 1 {
		return nil
	}
	return withSender(ctx, c, n-1, func(ctx context.Context, s *sender) error {
		for step := 1; step < n; step++ {
			to := (r + step) % n
			s.push(to, stepAllToAll, sendB[to])
		}
		for step := 1; step < n; step++ {
			from := (r - step + n) % n
			if err := c.recv(ctx, from, stepAllToAll, recvB[from]); err != nil {
				return err
			}
		}
		return nil
	})
}
