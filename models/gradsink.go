package models

import (
	G "gorgonia.org/gorgonia"
	"gorgonia.org/tensor"
)

// outSlot tells a gradient op to write its result into a parameter's Grad
// tensor instead of a buffer of its own (see WithGradsInPlace). It is
// shared by the op values of one node, so the Builder can fill it in after
// gorgonia built the node.
type outSlot struct{ dst *tensor.Dense }

// pick returns the tensor an op should try to write into: the slot's
// target when it has one, else the executor's prealloc.
func (s *outSlot) pick(prealloc G.Value) G.Value {
	if s == nil || s.dst == nil {
		return prealloc
	}
	return s.dst
}

// gradSinker is an op that can write its result into a given tensor: the
// ops that compute weight and bias gradients (matrix products, channel
// reductions, convolution weight gradients).
type gradSinker interface {
	sinkSlot() *outSlot
}

// WithGradsInPlace makes the graph's runs write each parameter's gradient
// straight into Param.Grad (allocated by Backward), where the gradient op
// supports it (Linear, Conv2d and the per-channel parameters of
// BatchNorm2d and LayerNorm): the copy CopyGrads makes, a few milliseconds
// per step for a model of millions of parameters, becomes unnecessary.
// CopyGrads still copies the gradients of parameters whose ops cannot.
//
// The price is a different contract: every run overwrites Param.Grad, so
//
//   - read or use Param.Grad after a run and before the next one; clear it
//     (an optimizer's ZeroGrad) before a run, never between a run and
//     CopyGrads;
//   - AccumulateGrads is refused (it would add a gradient to itself): to
//     accumulate over micro-batches use a Builder without this option.
//
// The Grad tensors keep their identity from run to run, so code holding
// them (a gradient allreduce, an optimizer) keeps working. Executors keep
// their own buffers for every other node as before.
func WithGradsInPlace() BuilderOption { return func(b *Builder) { b.inPlace = true } }

// sink points p's gradient op at p.Grad (allocating it if needed) and
// reports whether the op takes the hint.
func (b *Builder) sink(p *Param) bool {
	n := b.grads[p]
	if n == nil {
		return false
	}
	s, ok := n.Op().(gradSinker)
	if !ok || s.sinkSlot() == nil {
		return false
	}
	if p.Grad == nil || !p.Grad.Shape().Eq(p.Value.Shape()) || p.Grad.Dtype() != p.Value.Dtype() {
		p.Grad = newDense(p.Value.Dtype(), p.Value.Shape()...)
	}
	if !n.Shape().Eq(p.Grad.Shape()) {
		return false // the op produces another shape (a flattened view, say)
	}
	s.sinkSlot().dst = p.Grad
	return true
}
