package ddp

import (
	G "gorgonia.org/gorgonia"
)

// Gradients computed straight into the buckets, for DDP over a gorgonia
// graph.
//
// Under Tandem's graph executor, a synchronized pass that does not add to
// gradients accumulated under NoSync has the executor write each learnable
// node's gradient into its bucket view (graph.Program.SetOutput), as
// PyTorch's gradient_as_bucket_view does: the gradient hook then scales it
// by 1/world where it lies (the arithmetic of the copy it replaces, so the
// values are the same bits) and the bucket goes out with no copy in. Passes
// that accumulate (inside NoSync, and the synchronized pass after them) give
// the gradient nodes back to the executor's own buffers, since the bucket
// holds the running sum there.
//
// A gradient node qualifies only when nothing else reads its value: no other
// node of the graph takes it as an input (a gradient norm built into the
// graph, the gradient of an intermediate that the backward pass goes on
// from), and it is the gradient of one learnable node only. Its bucket is
// all-reduced in place while the backward pass goes on, so a reader would
// see the reduction half done. Other gradients are copied into the buckets
// as before; Stats tells the two apart (GradsInBucket, GradsCopied).

// findDirect marks the used learnable nodes whose gradient nodes have no
// reader: they may be computed straight into their bucket views. Whether
// the executor can write a node into given memory at all is SetOutput's to
// say (aimGrads).
func (n *GraphDDP) findDirect() {
	n.direct = make([]bool, len(n.nodes))
	if n.prog == nil {
		return
	}
	owners := map[*G.Node]int{}
	for _, pi := range n.gp.hooked {
		owners[n.grads[pi]]++
	}
	for _, pi := range n.gp.hooked {
		gn := n.grads[pi]
		n.direct[pi] = owners[gn] == 1 && n.g.To(gn.ID()).Len() == 0
	}
}

// aimGrads points the executor's gradient outputs for the pass in s: into
// the bucket views when the pass is synchronized and starts its buckets
// afresh, into the executor's own buffers otherwise. A gradient node the
// executor refuses as an output (SetOutput's checks) is copied from then on.
func (n *GraphDDP) aimGrads(s *stepState) {
	if n.prog == nil {
		return
	}
	into := s.pl.sync && !s.accum
	d := n.core
	for pi, ok := range n.direct {
		if !ok {
			continue
		}
		gn := n.grads[pi]
		if !into {
			_ = n.prog.SetOutput(gn, nil) // fails only for a node the program does not compute, never given an output
			continue
		}
		if err := n.prog.SetOutput(gn, d.view(pi)); err != nil {
			n.direct[pi] = false
			_ = n.prog.SetOutput(gn, nil)
		}
	}
}

// gradReady hands learnable node pi's gradient v to the pass's buckets:
// scaled where it lies when it was computed into its bucket view, copied
// (and scaled) into the view otherwise.
func (n *GraphDDP) gradReady(s *stepState, pi int, v G.Value) error {
	if s != nil && s.pl.sync && !s.accum && s.scale && n.direct[pi] {
		if view := n.core.view(pi); sameMemory(v, view) {
			scaleDense(view, s.inv64, s.inv32)
		}
	}
	return s.gradReady(pi, v)
}
