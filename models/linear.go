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
	bound := fanInBound(in)
	l := &Linear{In: in, Out: out}
	l.Weight = uniformParam("weight", c.dtype, c.rng, bound, out, in)
	if c.bias {
		l.Bias = uniformParam("bias", c.dtype, c.rng, bound, out)
	}
	return l, nil
}

// Params returns weight then bias.
func (l *Linear) Params() []*Param {
	if l.Bias == nil {
		return []*Param{l.Weight}
	}
	return []*Param{l.Weight, l.Bias}
}

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
	if l.Bias != nil {
		bn, err := b.Node(l.Bias)
		if err != nil {
			return nil, err
		}
		kind := chanAdd
		if relu {
			kind = chanAddReLU
		}
		if y, err = applyChan(kind, y, bn, 1); err != nil {
			return nil, err
		}
	} else if relu {
		if y, err = applyElt(eltReLU, y); err != nil {
			return nil, err
		}
	}
	if len(xs) != 2 {
		out := append(xs.Clone()[:len(xs)-1], l.Out)
		return G.Reshape(y, out)
	}
	return y, nil
}
