package models

import (
	"fmt"

	G "gorgonia.org/gorgonia"
	"gorgonia.org/tensor"

	"github.com/tandemml/tandem/graph"
)

// Where a gradient goes is the executor's business (graph.Program.SetOutput):
// the ops that compute weight and bias gradients (matrix products, channel
// reductions, convolution weight gradients) write into the buffer they are
// handed, as any op that reuses buffers does, and know only the factor to
// multiply their result by.

// gradScale is the factor a gradient op multiplies its result by: 1 unless
// SetGradTarget set another. It is shared by the op values of one node, so
// the Builder can set it after gorgonia built the node.
type gradScale struct {
	f float64
	// add: the op adds its scaled result into its output instead of
	// overwriting it (WithSGDInBackward).
	add bool
}

// factor returns the multiplier, 1 when none is set.
func (s *gradScale) factor() float64 {
	if s == nil || s.f == 0 {
		return 1
	}
	return s.f
}

// scaleDense multiplies t by f, in place, unless f is 1.
func scaleDense(t *tensor.Dense, f float64) {
	if f == 1 {
		return
	}
	switch d := t.Data().(type) {
	case []float64:
		for i := range d {
			d[i] *= f
		}
	case []float32:
		f32 := float32(f)
		for i := range d {
			d[i] *= f32
		}
	}
}

// gradSinker is an op that computes a parameter's gradient into the buffer
// it is given, multiplied by a factor of the Builder's choosing.
type gradSinker interface {
	scaleCell() *gradScale
}

// WithGradsInPlace makes the runs of a program compiled with Builder.Compile
// write each parameter's gradient straight into Param.Grad (allocated by
// Backward), where the gradient op supports it (Linear, Conv2d and the
// per-channel parameters of BatchNorm2d and LayerNorm): the copy CopyGrads
// makes, a few milliseconds per step for a model of millions of parameters,
// becomes unnecessary. CopyGrads still copies the gradients of parameters
// whose ops cannot, and all of them for graphs run by another executor.
//
// The price is a different contract: every run overwrites Param.Grad, so
//
//   - read or use Param.Grad after a run and before the next one; there is
//     nothing to clear before a run (an optimizer's ZeroGrad then only
//     spends a pass over the gradients' memory, the counterpart of
//     PyTorch's zero_grad(set_to_none=True), which skips that pass too),
//     and never clear it between a run and CopyGrads;
//   - AccumulateGrads is refused (it would add a gradient to itself): to
//     accumulate over micro-batches use a Builder without this option.
//
// The Grad tensors keep their identity from run to run, so code holding
// them (a gradient allreduce, an optimizer) keeps working. The executor
// keeps its own buffers for every other node as before.
func WithGradsInPlace() BuilderOption { return func(b *Builder) { b.inPlace = true } }

// Compile compiles the builder's graph for the graph executor, after
// Backward: graph.Compile with the parameters' gradient nodes given by
// graph.WithGrads (Program.Grad, OnGradReady), then opts. With
// WithGradsInPlace the program writes the gradients into Param.Grad (see
// there). CopyGrads keeps pointing the program last compiled here at
// Param.Grad when a Grad tensor is replaced.
func (b *Builder) Compile(opts ...graph.Option) (*graph.Program, error) {
	if err := b.checkFuseLR(); err != nil {
		return nil, err
	}
	ps := b.GradParams()
	wrt, grads := make(G.Nodes, len(ps)), make(G.Nodes, len(ps))
	for i, p := range ps {
		wrt[i], grads[i] = b.nodes[p], b.grads[p]
	}
	opts = append([]graph.Option{graph.WithGrads(wrt, grads)}, opts...)
	var fuse []*Param
	if b.fuseLR > 0 {
		var last G.Nodes
		fuse, last = b.fusable()
		opts = append(opts, graph.RunLast(last...))
	}
	prog, err := graph.Compile(b.g, opts...)
	if err != nil {
		return nil, fmt.Errorf("models: Compile: %w", err)
	}
	b.prog = prog
	if err := b.fuseSGD(prog, fuse); err != nil {
		return nil, err
	}
	if b.inPlace {
		for _, p := range ps {
			if !b.fused[p] {
				b.sink(p)
			}
		}
	}
	return prog, nil
}

// sink allocates p.Grad if needed, when p's gradient op can compute into
// it, and points the program last compiled with Compile at it; it reports
// whether the op takes it.
func (b *Builder) sink(p *Param) bool {
	if !b.sinks(p) {
		return false
	}
	if p.Grad == nil || !p.Grad.Shape().Eq(p.Value.Shape()) || p.Grad.Dtype() != p.Value.Dtype() {
		p.Grad = newDense(p.Value.Dtype(), p.Value.Shape()...)
	}
	return b.SetGradTarget(b.prog, p, p.Grad, 0)
}

// sinks reports whether p's gradient op computes into the buffer it is given.
func (b *Builder) sinks(p *Param) bool {
	n := b.grads[p]
	if n == nil {
		return false
	}
	s, ok := n.Op().(gradSinker)
	return ok && s.scaleCell() != nil
}

// SetGradTarget makes prog, a program compiled from the builder's graph,
// compute p's gradient, multiplied by scale (0 means 1), straight into dst
// on every run, with no buffer of the executor's in between and no copy
// after (graph.Program.SetOutput). dst must have p's shape and dtype and
// memory of its own that no other node's value shares; a nil dst turns the
// target off, and no run writes into the former target again.
//
// It reports whether p's gradient op takes the target: the ops of Linear,
// Conv2d and the per-channel parameters of BatchNorm2d and LayerNorm do; for
// the others, and for a dst that does not fit, the gradient stays in a
// buffer of the executor's, unscaled (read it from the gradient node's
// value). Call it after Backward, between runs.
//
// This is what a data-parallel wrapper uses to compute gradients into the
// buckets it reduces (PyTorch's gradient_as_bucket_view), the scale being
// its 1/world; the gradient then skips the copy into the bucket.
func (b *Builder) SetGradTarget(prog *graph.Program, p *Param, dst *tensor.Dense, scale float64) bool {
	if prog == nil || !b.sinks(p) || (prog == b.prog && b.fused[p]) {
		return false
	}
	n := b.grads[p]
	cell := n.Op().(gradSinker).scaleCell()
	if dst == nil || dst.Dtype() != p.Value.Dtype() || !dst.Shape().Eq(p.Value.Shape()) {
		cell.f = 0
		_ = prog.SetOutput(n, nil) // only fails for a node prog does not run
		return dst == nil && prog.Has(n)
	}
	if err := prog.SetOutput(n, dst); err != nil {
		cell.f = 0
		_ = prog.SetOutput(n, nil)
		return false
	}
	cell.f = scale
	return true
}
