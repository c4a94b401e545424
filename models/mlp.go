package models

import (
	"fmt"

	"github.com/tandemml/tandem/internal/errs"
)

// NewMLP returns a multilayer perceptron as a Sequential: Linear(sizes[0],
// sizes[1]), activation, Linear(sizes[1], sizes[2]), ..., Linear(sizes[n-2],
// sizes[n-1]) with no activation after the last Linear. The names match the
// same torch.nn.Sequential: "0.weight", "0.bias", "2.weight", ... .
//
// The options and their defaults: WithActivation (ActReLU), WithBias (true),
// WithRand (a DefaultSeed generator; the layers draw their weights from it
// in order, so one seeded generator reproduces the model) and WithDtype
// (tensor.Float32). The other layer options are passed to every Linear.
func NewMLP(sizes []int, opts ...Option) (*Sequential, error) {
	if len(sizes) < 2 {
		return nil, fmt.Errorf("models: NewMLP: an MLP needs at least 2 sizes (input and output), got %v: %w", sizes, errs.InvalidArgument)
	}
	c := newConfig(opts)
	// One generator for every layer, whether given or the default: each
	// Linear's own default would restart the stream.
	opts = append(append([]Option(nil), opts...), WithRand(c.rng))
	var layers []Module
	for i := 0; i+1 < len(sizes); i++ {
		l, err := NewLinear(sizes[i], sizes[i+1], opts...)
		if err != nil {
			return nil, fmt.Errorf("models: NewMLP: layer %d: %w", i, err)
		}
		layers = append(layers, l)
		if i+2 < len(sizes) {
			act, err := NewActivation(c.activation)
			if err != nil {
				return nil, fmt.Errorf("models: NewMLP: %w", err)
			}
			layers = append(layers, act)
		}
	}
	return NewSequential(layers...), nil
}
