package models

import (
	"fmt"

	G "gorgonia.org/gorgonia"

	"github.com/tandemml/tandem/internal/errs"
)

// ReLU is max(x, 0) elementwise, with derivative 0 at 0 (as PyTorch).
type ReLU struct{}

// Tanh is the hyperbolic tangent elementwise.
type Tanh struct{}

// GELU is the exact Gaussian error linear unit x·Φ(x), PyTorch's
// nn.GELU() default (approximate="none").
type GELU struct{}

// Params returns nothing: activations have no parameters.
func (ReLU) Params() []*Param { return nil }

// Buffers returns nothing.
func (ReLU) Buffers() []*Param { return nil }

// Forward applies ReLU.
func (ReLU) Forward(_ *Builder, x *G.Node) (*G.Node, error) { return applyElt(eltReLU, x) }

// Params returns nothing: activations have no parameters.
func (Tanh) Params() []*Param { return nil }

// Buffers returns nothing.
func (Tanh) Buffers() []*Param { return nil }

// Forward applies tanh.
func (Tanh) Forward(_ *Builder, x *G.Node) (*G.Node, error) {
	if err := checkFloat(x.Dtype()); err != nil {
		return nil, err
	}
	return G.Tanh(x)
}

// Params returns nothing: activations have no parameters.
func (GELU) Params() []*Param { return nil }

// Buffers returns nothing.
func (GELU) Buffers() []*Param { return nil }

// Forward applies GELU.
func (GELU) Forward(_ *Builder, x *G.Node) (*G.Node, error) { return applyElt(eltGELU, x) }

func applyElt(k eltKind, x *G.Node) (*G.Node, error) {
	if err := checkFloat(x.Dtype()); err != nil {
		return nil, err
	}
	return G.ApplyOp(eltOp{kind: k}, x)
}

// Activation names an activation function, as written in configuration
// files and fixture manifests.
type Activation string

// The activations NewActivation knows.
const (
	ActReLU Activation = "relu"
	ActTanh Activation = "tanh"
	ActGELU Activation = "gelu"
)

// NewActivation returns the module for name ("relu", "tanh" or "gelu").
func NewActivation(name Activation) (Module, error) {
	switch name {
	case ActReLU:
		return ReLU{}, nil
	case ActTanh:
		return Tanh{}, nil
	case ActGELU:
		return GELU{}, nil
	}
	return nil, fmt.Errorf("models: unknown activation %q (want relu, tanh or gelu): %w", string(name), errs.InvalidArgument)
}
