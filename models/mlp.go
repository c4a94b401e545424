package models

import (
	"fmt"
	"math/rand/v2"

	"github.com/tandemml/tandem/internal/errs"
)

// NewMLP returns a multilayer perceptron as a Sequential: Linear(sizes[0],
// sizes[1]), activation, Linear(sizes[1], sizes[2]), ..., Linear(sizes[n-2],
// sizes[n-1]) with no activation after the last Linear. The names match the
// same torch.nn.Sequential: "0.weight", "0.bias", "2.weight", ... . Weights
// are drawn from rng in layer order (nil means the DefaultSeed generator);
// the tensors are float32 unless opts add WithDtype(tensor.Float64) (WithRand
// and WithBias in opts are overridden by the arguments).
func NewMLP(sizes []int, activation Activation, bias bool, rng *rand.Rand, opts ...Option) (*Sequential, error) {
	if len(sizes) < 2 {
		return nil, fmt.Errorf("models: an MLP needs at least 2 sizes (input and output), got %v: %w", sizes, errs.InvalidArgument)
	}
	if rng == nil {
		rng = newConfig(nil).rng
	}
	opts = append(append([]Option(nil), opts...), WithRand(rng), WithBias(bias))
	var layers []Module
	for i := 0; i+1 < len(sizes); i++ {
		l, err := NewLinear(sizes[i], sizes[i+1], opts...)
		if err != nil {
			return nil, fmt.Errorf("models: MLP layer %d: %w", i, err)
		}
		layers = append(layers, l)
		if i+2 < len(sizes) {
			act, err := NewActivation(activation)
			if err != nil {
				return nil, err
			}
			layers = append(layers, act)
		}
	}
	return NewSequential(layers...), nil
}
