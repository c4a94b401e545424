package dist

import (
	G "gorgonia.org/gorgonia"

	"github.com/tandemml/tandem/comm"
)

// Ordering of collectives.
//
// A process group matches collectives across ranks by their position in each
// rank's sequence: the k-th collective one rank issues meets the k-th of every
// other rank. A dataflow executor that runs independent nodes in parallel
// could start two independent collectives of a graph in one order on one rank
// and in the other order on another, pairing the wrong operations (a
// fingerprint mismatch at best, silently mixed data at worst). Backward nodes
// are exposed to this just as much: the gradients of two independent branches
// are independent too.
//
// This package therefore chains the collectives of each (graph, group) pair:
// every collective node built on a graph takes the previous collective of the
// same group in that graph as one extra child, an ordering edge. The edge
// carries no data (the op ignores its value and DiffWRT says it has no
// gradient), but every executor respects it, so on every rank each collective
// starts only after the previous one of its group finished, in the order the
// nodes were built. That holds for the parallel executor of package graph,
// for its sequential mode and for gorgonia's TapeMachine alike, and it
// cannot deadlock: a node is always built after its inputs, so the chain
// follows an order that the data dependencies already allow.
//
// The sequence number of a collective (its position in the chain) is also
// part of its hash, with the group's identity, so that gorgonia never merges
// two collectives into one node.
//
// What the ranks must do in return is what every SPMD program does: build
// the same collectives on each group in the same order. gorgonia.Grad builds
// the backward collectives in the order its topological sort visits the
// forward ones, which is the same on every rank when every rank's graph has
// the same shape (as with ranks running one program). Collectives of
// different groups are not ordered with respect to each other, since the
// groups run independently; a graph used by two programs at once, or two
// graphs run concurrently on one group, is not ordered either.

// previous returns the collective of pg built last in g (the one with the
// highest sequence number), or nil if there is none.
func previous(g *G.ExprGraph, pg *comm.ProcessGroup) *G.Node {
	var last *G.Node
	seq := -1
	for _, n := range g.AllNodes() {
		if op, ok := n.Op().(*collective); ok && op.pg == pg && op.seq > seq {
			last, seq = n, op.seq
		}
	}
	return last
}

// chain returns the ordering child a new collective of pg on g needs (nil
// when it needs none) and the new collective's sequence number.
func chain(g *G.ExprGraph, pg *comm.ProcessGroup, data []*G.Node) (*G.Node, int) {
	prev := previous(g, pg)
	if prev == nil {
		return nil, 0
	}
	seq := prev.Op().(*collective).seq + 1
	for _, d := range data {
		if d == prev {
			return nil, seq // already a data input: the order follows
		}
	}
	return prev, seq
}
