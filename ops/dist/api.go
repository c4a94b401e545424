package dist

import (
	G "gorgonia.org/gorgonia"

	"github.com/tandemml/tandem/comm"
)

// AllReduce returns a node holding op applied across the ranks of pg to each
// rank's value of x, the same on every rank. x keeps its shape.
//
// Gradient: for sum, avg and premul_sum the all-reduce of the output
// gradients with the same op; for product the summed output gradient times
// the product of the other ranks' values; for max and min the summed output
// gradient, shared equally by the ranks holding the extreme value. band, bor
// and bxor take integer tensors and refuse to be differentiated.
func AllReduce(pg *comm.ProcessGroup, x *G.Node, op comm.ReduceOp) (*G.Node, error) {
	return build(pg, spec{kind: kindAllReduce, red: op}, x)
}

// Broadcast returns a node holding rank src's value of x on every rank.
//
// Gradient: rank src receives the sum of every rank's output gradient (a
// reduce to src); the other ranks' x receive zero.
func Broadcast(pg *comm.ProcessGroup, x *G.Node, src int) (*G.Node, error) {
	return build(pg, spec{kind: kindBroadcast, root: src}, x)
}

// Reduce returns a node holding, on rank dst, op applied across the ranks to
// each rank's value of x; on every other rank it holds zeros, which carry no
// gradient.
//
// Gradient: rank dst's output gradient, broadcast to every rank and weighed
// by the reduce op as for AllReduce (c times it for the linear ops, the
// product of the other ranks' values for product, equal shares among the
// extreme values for max and min).
func Reduce(pg *comm.ProcessGroup, x *G.Node, dst int, op comm.ReduceOp) (*G.Node, error) {
	return build(pg, spec{kind: kindReduce, red: op, root: dst}, x)
}

// AllGather returns one node per rank, the k-th holding rank k's value of x,
// on every rank. The nodes are blocks of one stacked node of shape
// [world, x's shape...] that a single collective fills.
//
// Gradient: rank k's x receives the sum over ranks of the gradients arriving
// at their k-th output (a reduce-scatter).
func AllGather(pg *comm.ProcessGroup, x *G.Node) (G.Nodes, error) {
	st, err := build(pg, spec{kind: kindAllGather}, x)
	if err != nil {
		return nil, err
	}
	return unstack(st, pg.Size())
}

// AllGatherIntoTensor returns a node holding every rank's x concatenated
// along dimension 0, rank k's at block k: shape [world*d0, d1, ...] for x of
// shape [d0, d1, ...] (and [world] for a scalar x).
//
// Gradient: the reduce-scatter (sum) of the output gradients: rank k's x
// receives the sum of every rank's gradient at block k.
func AllGatherIntoTensor(pg *comm.ProcessGroup, x *G.Node) (*G.Node, error) {
	return build(pg, spec{kind: kindAllGatherIntoTensor}, x)
}

// Gather returns one node per rank: on rank dst the k-th holds rank k's value
// of x; on every other rank they hold zeros, which carry no gradient. The
// nodes are blocks of one stacked node that a single collective fills.
//
// Gradient: rank k's x receives the gradient arriving at rank dst's k-th
// output (a scatter from dst).
func Gather(pg *comm.ProcessGroup, x *G.Node, dst int) (G.Nodes, error) {
	st, err := build(pg, spec{kind: kindGather, root: dst}, x)
	if err != nil {
		return nil, err
	}
	return unstack(st, pg.Size())
}

// Scatter returns a node holding, on rank k, rank src's ins[k]. Every rank
// passes world nodes of one shape and dtype, as in PyTorch; off src they only
// give the output's shape and dtype (their values are not sent) and receive
// zero gradients.
//
// Gradient: rank src's ins[k] receives rank k's output gradient (a gather to
// src).
func Scatter(pg *comm.ProcessGroup, ins G.Nodes, src int) (*G.Node, error) {
	return build(pg, spec{kind: kindScatter, root: src, list: true}, ins...)
}

// ReduceScatter returns a node holding, on rank k, op applied across the
// ranks to their ins[k]. Every rank passes world nodes of one shape and dtype.
//
// Gradient: rank q's ins[k] receives rank k's output gradient, weighed as for
// AllReduce: c times it for the linear ops (an all-gather), and for product,
// max and min the weight of rank q's value among the values reduced into
// rank k's output (two all-to-alls carry values there and shares back).
func ReduceScatter(pg *comm.ProcessGroup, ins G.Nodes, op comm.ReduceOp) (*G.Node, error) {
	return build(pg, spec{kind: kindReduceScatter, red: op, list: true}, ins...)
}

// ReduceScatterTensor is ReduceScatter with every rank's inputs concatenated
// along dimension 0 in x: x's dimension 0 is world times the output's, and
// block k of x goes into rank k's output.
func ReduceScatterTensor(pg *comm.ProcessGroup, x *G.Node, op comm.ReduceOp) (*G.Node, error) {
	return build(pg, spec{kind: kindReduceScatterTensor, red: op}, x)
}

// AllToAll returns one node per rank: on rank r the k-th holds rank k's
// ins[r]. Every rank passes world nodes of one shape and dtype. The outputs
// are blocks of one stacked node that a single collective fills.
//
// Gradient: the all-to-all of the output gradients: rank k's ins[r] receives
// the gradient at rank r's k-th output.
func AllToAll(pg *comm.ProcessGroup, ins G.Nodes) (G.Nodes, error) {
	st, err := build(pg, spec{kind: kindAllToAll, list: true}, ins...)
	if err != nil {
		return nil, err
	}
	return unstack(st, pg.Size())
}

// AllToAllSingle returns a node holding the rows of x that every rank sends
// to this one, in rank order: inSplits[j] rows of x (consecutive, starting
// with rank 0's share) go to rank j, and outSplits[i] rows come from rank i.
// A nil split means equal parts of x's dimension 0. The output has
// sum(outSplits) rows and x's other dimensions; inSplits[rank] must equal
// outSplits[rank].
//
// Gradient: the rows of the output gradient travel back the way they came
// (all_to_all_single with the splits swapped).
func AllToAllSingle(pg *comm.ProcessGroup, x *G.Node, outSplits, inSplits []int) (*G.Node, error) {
	return build(pg, spec{kind: kindAllToAllSingle, outSplits: outSplits, inSplits: inSplits}, x)
}
