package models

import (
	"math/rand/v2"

	"gorgonia.org/tensor"
)

// Option configures a layer constructor.
type Option func(*config)

type config struct {
	dtype      tensor.Dtype
	rng        *rand.Rand
	bias       bool
	activation Activation

	kernel, stride, padding, dilation *[2]int

	epsilon, momentum *float64
	noAffine          bool
}

func (c config) eps(def float64) float64 {
	if c.epsilon != nil {
		return *c.epsilon
	}
	return def
}

func (c config) affine() bool { return !c.noAffine }

// DefaultSeed seeds the generator a constructor uses when no WithRand is
// given. Layers built without a generator therefore all start from the same
// stream; pass one shared generator to get distinct, reproducible weights.
const DefaultSeed = 0

func newConfig(opts []Option) config {
	c := config{dtype: tensor.Float32, bias: true, activation: ActReLU}
	for _, o := range opts {
		o(&c)
	}
	if c.rng == nil {
		c.rng = rand.New(rand.NewPCG(DefaultSeed, DefaultSeed))
	}
	return c
}

// WithDtype sets the element type of the layer's tensors: tensor.Float32
// (the default, as in PyTorch) or tensor.Float64, which the exact parity
// tests use. The weights are drawn in float64 and rounded, so a float32 model
// holds the float64 model's values rounded to float32.
func WithDtype(dt tensor.Dtype) Option { return func(c *config) { c.dtype = dt } }

// WithRand sets the generator that draws the initial weights. Layers draw
// from it in construction order, so one seeded generator reproduces a model.
func WithRand(r *rand.Rand) Option { return func(c *config) { c.rng = r } }

// WithBias sets whether Linear, Conv2d and the layers of NewMLP have a bias
// (default true), like PyTorch's bias=... argument.
func WithBias(bias bool) Option { return func(c *config) { c.bias = bias } }

// WithActivation sets the activation NewMLP puts between its Linear layers
// (default ActReLU).
func WithActivation(a Activation) Option { return func(c *config) { c.activation = a } }

// WithKernel sets a rectangular kernel (height, width) for Conv2d and
// MaxPool2d, overriding the square kernel argument.
func WithKernel(h, w int) Option { return func(c *config) { c.kernel = &[2]int{h, w} } }

// WithStride sets the stride (height, width) of Conv2d (default 1) and
// MaxPool2d (default the kernel).
func WithStride(h, w int) Option { return func(c *config) { c.stride = &[2]int{h, w} } }

// WithPadding sets the zero padding (height, width) of Conv2d, or the -∞
// padding of MaxPool2d (default 0).
func WithPadding(h, w int) Option { return func(c *config) { c.padding = &[2]int{h, w} } }

// WithDilation sets the dilation (height, width) of Conv2d (default 1).
func WithDilation(h, w int) Option { return func(c *config) { c.dilation = &[2]int{h, w} } }

// WithEps sets the epsilon added to the variance by LayerNorm and
// BatchNorm2d (default 1e-5).
func WithEps(eps float64) Option { return func(c *config) { c.epsilon = &eps } }

// WithMomentum sets BatchNorm2d's running-statistics momentum (default 0.1).
func WithMomentum(m float64) Option { return func(c *config) { c.momentum = &m } }

// WithAffine sets whether LayerNorm and BatchNorm2d have a learnable weight
// and bias (default true), like PyTorch's elementwise_affine / affine.
func WithAffine(affine bool) Option { return func(c *config) { c.noAffine = !affine } }
