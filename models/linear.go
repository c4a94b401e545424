package models

import (
	"fmt"

	G "gorgonia.org/gorgonia"
	"gorgonia.org/tensor"

	"github.com/tandemml/tandem/internal/errs"
)

// Linear is y = x·Wᵀ + b, PyTorch's nn.Linear: Weight is [out, in], Bias is
// [out] (nil without bias), both initialised from U(-1/√in, 1/√in) as
// PyTorch does (kaiming_uniform_ with a=√5 for the weight).
type Linear struct {
	In, Out int
	Weight  *Param
	Bias    *Param
}

// NewLinear returns a Linear layer from in to out features. Options:
// WithDtype, WithRand, WithBias(false).
func NewLinear(in, out int, opts ...Option) (*Linear, error) {
	if in <= 0 || out <= 0 {
		return nil, fmt.Errorf("models: Linear needs positive sizes, got in=%d out=%d: %w", in, out, errs.InvalidArgument)
	}
	c := newConfig(opts)
	if err := checkFloat(c.dtype); err != nil {
		return nil, fmt.Errorf("%w: %w", errs.InvalidArgument, err)
	}
	l := &Linear{In: in, Out: out}
	l.Weight, l.Bias = weightBias(c, in, out, in)
	return l, nil
}

// Params returns weight then bias.
func (l *Linear) Params() []*Param { return paramsOf(l.Weight, l.Bias) }

// Buffers returns nothing.
func (l *Linear) Buffers() []*Param { return nil }

// Forward maps x of shape [..., in] to [..., out] with one GEMM (the weight
// transpose is a GEMM flag, not a copy) and one bias pass.
func (l *Linear) Forward(b *Builder, x *G.Node) (*G.Node, error) { return l.forward(b, x, false) }

// forwardReLU is Forward followed by ReLU, with the bias and the ReLU in one
// pass (Sequential uses it for a Linear followed by a ReLU).
func (l *Linear) forwardReLU(b *Builder, x *G.Node) (*G.Node, error) { return l.forward(b, x, true) }

func (l *Linear) forward(b *Builder, x *G.Node, relu bool) (*G.Node, error) {
	xs := x.Shape()
	if len(xs) == 0 || xs[len(xs)-1] != l.In {
		return nil, fmt.Errorf("models: Linear(%d, %d) got input of shape %v (last axis must be %d): %w", l.In, l.Out, xs, l.In, errs.InvalidArgument)
	}
	w, err := b.Node(l.Weight)
	if err != nil {
		return nil, err
	}
	in := x
	if len(xs) != 2 {
		if in, err = G.Reshape(x, tensor.Shape{xs.TotalSize() / l.In, l.In}); err != nil {
			return nil, err
		}
	}
	y, err := matMulT(b, in, w, false, true)
	if err != nil {
		return nil, fmt.Errorf("models: Linear(%d, %d): %w", l.In, l.Out, err)
	}
	if y, err = addBias(b, y, l.Bias, relu); err != nil {
		return nil, err
	}
	if len(xs) != 2 {
		out := append(xs.Clone()[:len(xs)-1], l.Out)
		return G.Reshape(y, out)
	}
	return y, nil
}

// weightBias draws the weight of shape wShape and, when c asks for one, the
// bias of shape [wShape[0]], both uniform in ±1/√fanIn, as PyTorch's Linear
// and Conv2d initialise them (weight first, from c's generator).
func weightBias(c config, fanIn int, wShape ...int) (weight, bias *Param) {
	bound := fanInBound(fanIn)
	weight = uniformParam("weight", c.dtype, c.rng, bound, wShape...)
	if c.bias {
		bias = uniformParam("bias", c.dtype, c.rng, bound, wShape[0])
	}
	return weight, bias
}

// paramsOf is the Params of a layer with a weight and an optional bias.
func paramsOf(weight, bias *Param) []*Param {
	if bias == nil {
		return []*Param{weight}
	}
	return []*Param{weight, bias}
}

// addBias adds bias (nil for none) to y along axis 1, followed by a ReLU
// in the same pass when relu is set: the tail of Linear's and Conv2d's
// forward passes.
func addBias(b *Builder, y *G.Node, bias *Param, relu bool) (*G.Node, error) {
	if bias == nil {
		if relu {
			return applyElt(eltReLU, y)
		}
		return y, nil
	}
	bn, err := b.Node(bias)
	if err != nil {
		return nil, err
	}
	if relu {
		return applyChan(chanAddReLU, y, bn, 1)
	}
	return applyChan(chanAdd, y, bn, 1)
}
