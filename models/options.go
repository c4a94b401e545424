package models

import (
	"math/rand/v2"

	"gorgonia.org/tensor"
)

// Option configures a layer constructor.
type Option func(*config)

type config struct {
	dtype tensor.Dtype
	rng   *rand.Rand
	bias  bool
}

// DefaultSeed seeds the generator a constructor uses when no WithRand is
// given. Layers built without a generator therefore all start from the same
// stream; pass one shared generator to get distinct, reproducible weights.
const DefaultSeed = 0

func newConfig(opts []Option) config {
	c := config{dtype: tensor.Float64, bias: true}
	for _, o := range opts {
		o(&c)
	}
	if c.rng == nil {
		c.rng = rand.New(rand.NewPCG(DefaultSeed, DefaultSeed))
	}
	return c
}

// WithDtype sets the element type of the layer's tensors: tensor.Float64
// (the default) or tensor.Float32.
func WithDtype(dt tensor.Dtype) Option { return func(c *config) { c.dtype = dt } }

// WithRand sets the generator that draws the initial weights. Layers draw
// from it in construction order, so one seeded generator reproduces a model.
func WithRand(r *rand.Rand) Option { return func(c *config) { c.rng = r } }

// WithBias sets whether Linear and Conv2d have a bias (default true), like
// PyTorch's bias=... argument.
func WithBias(bias bool) Option { return func(c *config) { c.bias = bias } }
