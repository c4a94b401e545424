package dist

import (
	"fmt"

	G "gorgonia.org/gorgonia"

	"github.com/tandemml/tandem/comm"
)

// Backward rules.
//
// The objective is the sum over ranks of every rank's loss, L = sum_r L_r,
// and gy_r is dL/dy_r, the gradient arriving at rank r's output. Each rule
// below is the exact gradient of L with respect to rank r's input, and each
// is itself built from collectives (so that every rank's gradient sees every
// other rank's gy). With c the reduce op's linear coefficient (1 for sum,
// 1/world for avg, f for premul_sum(f)):
//
//	all_reduce(sum|avg|premul)  dx_r = c * sum_q gy_q            all_reduce(gy, same op)
//	all_reduce(product|min|max) dx_r = (sum_q gy_q) * w_r(x)     all_gather(x), all_reduce(gy)
//	broadcast(src)              dx_src = sum_q gy_q, else 0      reduce(gy, sum, dst=src)
//	reduce(dst, linear)         dx_r = c * gy_dst                broadcast(gy, src=dst) * c
//	reduce(dst, product|...)    dx_r = gy_dst * w_r(x)           all_gather(x), broadcast(gy)
//	all_gather                  dx_k = sum_r gy_r[k]             reduce_scatter(gy, sum)
//	all_gather_into_tensor      the same, on the concatenation   reduce_scatter_tensor(gy, sum)
//	gather(dst)                 dx_k = gy_dst[k]                 scatter(gy, src=dst)
//	scatter(src)                dins_src[k] = gy_k, else 0       gather(gy, dst=src)
//	reduce_scatter(linear)      dins_q[r] = c * gy_r             all_gather(gy) * c
//	reduce_scatter(product|...) dins_q[r] = gy_r * w_q(ins_.[r]) all_to_all twice
//	reduce_scatter_tensor       as reduce_scatter, on blocks     all_gather_into_tensor / all_to_all
//	all_to_all                  dins_r[k] = gy_k[r]              all_to_all(gy)
//	all_to_all_single           rows travel back                 all_to_all_single(gy, splits swapped)
//
// w_q is rank q's weight: for product the product of the other ranks'
// values, for max and min 1/count when q holds the extreme value (count ranks
// do) and 0 otherwise (see weights.go). Outputs a rank does not receive (off
// the root of reduce and gather) are constant zeros, so the gradient arriving
// there is ignored. Bitwise reductions and integer tensors have no gradient,
// and SymDiff says so.

// SymDiff builds the gradient nodes of the op's inputs from grad, the
// gradient of its output, as described above. The ordering edge gets none.
func (op *collective) SymDiff(inputs G.Nodes, output, grad *G.Node) (G.Nodes, error) {
	if len(inputs) != op.Arity() {
		return nil, fmt.Errorf("dist: %v: SymDiff got %d inputs, want %d: %w", op, len(inputs), op.Arity(), ErrInvalidArgument)
	}
	if grad == nil {
		return nil, fmt.Errorf("dist: %v: SymDiff got no gradient node: %w", op, ErrInvalidArgument)
	}
	if err := op.differentiable(); err != nil {
		return nil, err
	}
	data := inputs[:op.nData]
	grads, err := op.backward(data, grad)
	if err != nil {
		return nil, fmt.Errorf("dist: %v: building the backward pass: %w", op, err)
	}
	for i, g := range grads {
		if !g.Shape().Eq(data[i].Shape()) {
			return nil, fmt.Errorf("dist: %v: gradient of input %d has shape %v, the input has %v: %w", op, i, g.Shape(), data[i].Shape(), ErrInvalidArgument)
		}
	}
	out := make(G.Nodes, len(inputs)) // the ordering edge, if any, stays nil
	copy(out, grads)
	return out, nil
}

// differentiable explains why the op has no gradient, or returns nil.
func (op *collective) differentiable() error {
	switch op.kind {
	case kindAllReduceGrad, kindReduceGrad, kindReduceScatterGrad:
		return fmt.Errorf("dist: %v: second derivatives through %v reductions are not implemented: %w", op, op.red, ErrNotDifferentiable)
	}
	if op.kind.reduces() {
		switch op.red.Kind() {
		case comm.KindBAnd, comm.KindBOr, comm.KindBXor:
			return fmt.Errorf("dist: %v: reduce op %v is bitwise and has no gradient (bitwise reductions take integer tensors only); keep %s with %v out of the differentiated part of the graph: %w",
				op, op.red, op.kind, op.red, ErrNotDifferentiable)
		}
	}
	if !isFloat(op.dt) {
		return fmt.Errorf("dist: %v: %s of %v tensors has no gradient; only float32 and float64 collectives can be differentiated: %w", op, op.kind, op.dt, ErrNotDifferentiable)
	}
	return nil
}

// linear reports whether the reduce op is linear and returns its coefficient.
func (op *collective) linear() (float64, bool) {
	switch op.red.Kind() {
	case comm.KindSum:
		return 1, true
	case comm.KindAvg:
		return 1 / float64(op.pg.Size()), true
	case comm.KindPremulSum:
		return op.red.Factor(), true
	}
	return 0, false
}

// backward returns the gradient node of each data input.
func (op *collective) backward(data G.Nodes, gy *G.Node) (G.Nodes, error) {
	pg, s := op.pg, op.scale
	one := func(n *G.Node, err error) (G.Nodes, error) {
		if err != nil {
			return nil, err
		}
		return G.Nodes{n}, nil
	}
	switch op.kind {
	case kindAllReduce:
		if _, ok := op.linear(); ok {
			return one(build(pg, spec{kind: kindAllReduce, red: op.red, scale: s}, gy))
		}
		return one(build(pg, spec{kind: kindAllReduceGrad, red: op.red, scale: s}, data[0], gy))

	case kindBroadcast:
		return one(build(pg, spec{kind: kindReduce, red: comm.Sum, root: op.root, scale: s}, gy))

	case kindReduce:
		if c, ok := op.linear(); ok {
			return one(build(pg, spec{kind: kindBroadcast, root: op.root, scale: s * c}, gy))
		}
		return one(build(pg, spec{kind: kindReduceGrad, red: op.red, root: op.root, scale: s}, data[0], gy))

	case kindAllGather:
		return one(build(pg, spec{kind: kindReduceScatter, red: comm.Sum, scale: s}, gy))

	case kindAllGatherIntoTensor:
		if len(data[0].Shape()) == 0 { // scalars: the concatenation is a stack
			return one(build(pg, spec{kind: kindReduceScatter, red: comm.Sum, scale: s}, gy))
		}
		return one(build(pg, spec{kind: kindReduceScatterTensor, red: comm.Sum, scale: s}, gy))

	case kindGather:
		return one(build(pg, spec{kind: kindScatter, root: op.root, scale: s}, gy))

	case kindScatter:
		return op.unstack(build(pg, spec{kind: kindGather, root: op.root, scale: s}, gy))

	case kindReduceScatter:
		if c, ok := op.linear(); ok {
			return op.unstack(build(pg, spec{kind: kindAllGather, scale: s * c}, gy))
		}
		args := append(append(G.Nodes(nil), data...), gy)
		return op.unstack(build(pg, spec{kind: kindReduceScatterGrad, red: op.red, list: op.list, scale: s}, args...))

	case kindReduceScatterTensor:
		if c, ok := op.linear(); ok {
			return one(build(pg, spec{kind: kindAllGatherIntoTensor, scale: s * c}, gy))
		}
		return one(build(pg, spec{kind: kindReduceScatterGrad, red: op.red, scale: s}, data[0], gy))

	case kindAllToAll:
		return op.unstack(build(pg, spec{kind: kindAllToAll, scale: s}, gy))

	case kindAllToAllSingle:
		return one(build(pg, spec{kind: kindAllToAllSingle, inSplits: op.outSplits, outSplits: op.inSplits, scale: s}, gy))
	}
	return nil, fmt.Errorf("no backward rule for kind %v: %w", op.kind, ErrNotDifferentiable)
}

// unstack turns the stacked gradient of a per-rank input into the gradient
// of each input node: one block per rank for a list, the stack itself for a
// packed input.
func (op *collective) unstack(stacked *G.Node, err error) (G.Nodes, error) {
	if err != nil {
		return nil, err
	}
	if !op.list {
		return G.Nodes{stacked}, nil
	}
	return unstack(stacked, op.pg.Size())
}
