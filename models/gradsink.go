package models

import (
	G "gorgonia.org/gorgonia"
	"gorgonia.org/tensor"
)

// outSlot tells a gradient op to write its result into a parameter's Grad
// tensor, or another tensor of the right shape, instead of a buffer of its
// own (see WithGradsInPlace and Builder.SetGradTarget), multiplied by
// scale when that is neither 0 nor 1. It is shared by the op values of one
// node, so the Builder can fill it in after gorgonia built the node.
type outSlot struct {
	dst   *tensor.Dense
	scale float64
	// former: targets set before the current one (the last few), which an
	// executor may still offer as the node's buffer, having seen the op
	// write there; they belong to whoever set them, so the op never writes
	// into them again unless they are the target.
	former []*tensor.Dense
}

// retarget sets the slot's target, remembering the one it replaces.
func (s *outSlot) retarget(dst *tensor.Dense, scale float64) {
	if s.dst != nil && s.dst != dst {
		s.former = append(s.former, s.dst)
		if len(s.former) > maxFormerTargets {
			s.former = s.former[1:]
		}
	}
	s.dst, s.scale = dst, scale
}

// maxFormerTargets bounds outSlot.former.
const maxFormerTargets = 8

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

// factor is the multiplier the op applies to its result: 1 unless a
// target with a scale is set.
func (s *outSlot) factor() float64 {
	if s == nil || s.dst == nil || s.scale == 0 {
		return 1
	}
	return s.scale
}

// pick returns the tensor an op should try to write into: the slot's
// target when it has one, else the executor's prealloc.
func (s *outSlot) pick(prealloc G.Value) G.Value {
	if s == nil {
		return prealloc
	}
	if s.dst != nil {
		return s.dst
	}
	if prealloc != nil {
		for _, f := range s.former {
			if overlapsAny(prealloc, []G.Value{f}) {
				return nil // a former target, not the executor's
			}
		}
	}
	return prealloc
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
	return b.SetGradTarget(p, p.Grad, 0)
}

// SetGradTarget points the gradient op of p at dst: each run then computes
// p's gradient, multiplied by scale (0 means 1), straight into dst, with no
// buffer of the executor's in between and no copy after. dst must have p's
// shape and dtype and memory of its own that no other node's value shares;
// a nil dst turns the target off. It reports whether p's gradient op takes
// the target: the ops of Linear, Conv2d and the per-channel parameters of
// BatchNorm2d and LayerNorm do; for the others, and for a dst that does not
// fit, the gradient stays in a buffer of the executor's (read it from the
// gradient node's value). Call it after Backward, between runs. Once a
// target is replaced or cleared, the op does not write into it again, even
// where the executor offers it as the node's buffer (the last eight
// targets are remembered).
//
// This is what a data-parallel wrapper uses to compute gradients into the
// buckets it reduces (PyTorch's gradient_as_bucket_view), the scale being
// its 1/world; the gradient then skips the copy into the bucket.
func (b *Builder) SetGradTarget(p *Param, dst *tensor.Dense, scale float64) bool {
	n := b.grads[p]
	if n == nil {
		return false
	}
	s, ok := n.Op().(gradSinker)
	if !ok || s.sinkSlot() == nil {
		return false
	}
	if dst == nil {
		s.sinkSlot().retarget(nil, 0)
		return true
	}
	if dst.Dtype() != p.Value.Dtype() || !dst.Shape().Eq(p.Value.Shape()) || !n.Shape().Eq(dst.Shape()) || dst.IsView() || dst.RequiresIterator() {
		s.sinkSlot().retarget(nil, 0)
		return false
	}
	s.sinkSlot().retarget(dst, scale)
	return true
}
