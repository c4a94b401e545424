package models

import (
	"fmt"
	"math"

	G "gorgonia.org/gorgonia"

	"github.com/tandemml/tandem/graph"
	"github.com/tandemml/tandem/internal/errs"
)

// Plain SGD fused into the backward pass.
//
// A training step that computes a weight's gradient and then updates the
// weight goes over memory three times for it: the product writes the
// gradient, the optimizer reads it and the weight and writes the weight
// (and ZeroGrad clears the gradient before the next run). For plain SGD,
// p ← p − lr·g, the product can add −lr times the gradient straight into
// the weight (C = α·A·B + β·C with α = −lr, β = 1): one pass, and no
// gradient in memory at all. For the MLP of `tandem bench train` that is
// 0.8 ms of a 6.2 ms step.
//
// The update must not reach the weight before every node that reads it has
// run (the backward product for the layer's input reads it), so the fused
// products run after every other node of the program (graph.RunLast).

// WithSGDInBackward makes Compile fuse plain SGD with learning rate lr (no
// momentum, no weight decay, no dampening) into the backward pass for every
// parameter whose gradient is one matrix product (the weights of Linear
// layers): each run then updates those parameters itself, p ← p − lr·∂loss/∂p,
// as a last step, and never stores their gradient. SGDInBackward tells
// which parameters the run updates and which it leaves to an optimizer (the
// biases, parameters of other layers, and weights used more than once).
//
// The update rounds like optim.SGD's up to the last bit (the product adds
// lr times its sum into the weight with one fused operation, optim.SGD
// rounds the gradient first). The fused parameters have no gradient to
// read, clip, all-reduce or accumulate: Param.Grad is left alone, CopyGrads
// skips them, SetGradTarget refuses them, and a data-parallel wrapper must
// not be used on such a program. lr must be positive.
func WithSGDInBackward(lr float64) BuilderOption {
	return func(b *Builder) { b.fuseLR = lr }
}

// SGDInBackward returns the parameters that each run of the program last
// compiled with WithSGDInBackward updates itself (fused), and the other
// parameters that have gradients (rest), for an optimizer of the caller's
// (with the same learning rate, for plain SGD throughout). Without the
// option every parameter with a gradient is in rest.
func (b *Builder) SGDInBackward() (fused, rest []*Param) {
	for _, p := range b.GradParams() {
		if b.fused[p] {
			fused = append(fused, p)
		} else {
			rest = append(rest, p)
		}
	}
	return fused, rest
}

// fuses reports whether p's gradient op can add its scaled result into the
// parameter (a matrix product).
func (b *Builder) fuses(p *Param) bool {
	n := b.grads[p]
	if n == nil {
		return false
	}
	op, ok := n.Op().(matMulOp)
	return ok && op.scale != nil
}

// fusable returns the parameters whose gradient op can add its scaled
// result into the parameter, with their gradient nodes.
func (b *Builder) fusable() ([]*Param, G.Nodes) {
	var ps []*Param
	var ns G.Nodes
	for _, p := range b.GradParams() {
		if b.fuses(p) {
			ps = append(ps, p)
			ns = append(ns, b.grads[p])
		}
	}
	return ps, ns
}

// fuseSGD points the fused gradient products of prog (compiled with
// graph.RunLast on them) at their parameters, adding −lr times the product.
func (b *Builder) fuseSGD(prog *graph.Program, ps []*Param) error {
	b.fused = make(map[*Param]bool, len(ps))
	for _, p := range ps {
		n := b.grads[p]
		if err := prog.SetOutput(n, p.Value); err != nil {
			return fmt.Errorf("models: WithSGDInBackward: parameter %s: %w", p.Name, err)
		}
		cell := n.Op().(gradSinker).scaleCell()
		cell.f, cell.add = -b.fuseLR, true
		b.fused[p] = true
	}
	return nil
}

// checkFuseLR validates WithSGDInBackward's learning rate.
func (b *Builder) checkFuseLR() error {
	if b.fuseLR < 0 || math.IsNaN(b.fuseLR) {
		return fmt.Errorf("models: WithSGDInBackward(%v): the learning rate must be positive: %w", b.fuseLR, errs.InvalidArgument)
	}
	return nil
}

// describe names a value for an error: its type, dtype and shape.
func describe(v G.Value) string {
	if v == nil {
		return "no output"
	}
	return fmt.Sprintf("%T of %v %v", v, v.Dtype(), v.Shape())
}
