package models

import (
	"fmt"
	"math"
	"math/rand/v2"
	"strings"

	"gorgonia.org/tensor"

	"github.com/tandemml/tandem/internal/errs"
)

// Init fills dst, the values of a new tensor of the given shape in row-major
// order, as float64; NewParam rounds them to the parameter's dtype. The
// initializers below follow torch.nn.init; a user may write others.
type Init func(shape []int, dst []float64) error

// NewParam returns a learnable parameter named name (one state_dict segment:
// "weight", "scale"; no dots, which a container adds when it names its
// children) of the given shape and dtype (tensor.Float32 or tensor.Float64),
// filled by init (Zeros when nil). It is what NewLinear and the other layers
// build their tensors with, so a module written by the user owns parameters
// indistinguishable from theirs:
//
//	w, err := models.NewParam("weight", []int{out, in}, tensor.Float32, models.FanInUniform(in, rng))
func NewParam(name string, shape []int, dtype tensor.Dtype, init Init) (*Param, error) {
	return makeParam(name, shape, dtype, init, true)
}

// NewBuffer is NewParam for state that is saved in the state_dict but not
// learned (RequiresGrad false), like a buffer registered with PyTorch's
// register_buffer (BatchNorm's running statistics).
func NewBuffer(name string, shape []int, dtype tensor.Dtype, init Init) (*Param, error) {
	return makeParam(name, shape, dtype, init, false)
}

func makeParam(name string, shape []int, dtype tensor.Dtype, init Init, requiresGrad bool) (*Param, error) {
	if err := checkName(name); err != nil {
		return nil, err
	}
	if err := checkFloat(dtype); err != nil {
		return nil, fmt.Errorf("models: parameter %q: %w: %w", name, err, errs.InvalidArgument)
	}
	if len(shape) == 0 {
		return nil, fmt.Errorf("models: parameter %q needs at least one dimension (use [1] for a scalar): %w", name, errs.InvalidArgument)
	}
	n := 1
	for _, d := range shape {
		if d <= 0 {
			return nil, fmt.Errorf("models: parameter %q has shape %v; every dimension must be positive: %w", name, shape, errs.InvalidArgument)
		}
		n *= d
	}
	vals := make([]float64, n)
	if init != nil {
		if err := init(append([]int(nil), shape...), vals); err != nil {
			return nil, fmt.Errorf("models: initialising parameter %q of shape %v: %w", name, shape, err)
		}
	}
	return newParam(name, dtype, requiresGrad, shape, func(i int) float64 { return vals[i] }), nil
}

// checkName refuses names that would break state_dict naming.
func checkName(name string) error {
	if name == "" || strings.Contains(name, ".") {
		return fmt.Errorf("models: name %q must be non-empty and free of dots (dots separate a child's name from its tensors'): %w", name, errs.InvalidArgument)
	}
	return nil
}

// Zeros fills with 0 (torch.nn.init.zeros_).
func Zeros() Init { return Constant(0) }

// Ones fills with 1 (torch.nn.init.ones_).
func Ones() Init { return Constant(1) }

// Constant fills with v (torch.nn.init.constant_).
func Constant(v float64) Init {
	return func(_ []int, dst []float64) error {
		for i := range dst {
			dst[i] = v
		}
		return nil
	}
}

// Uniform draws from U(lo, hi) with rng (torch.nn.init.uniform_). A nil rng
// is a new generator seeded with DefaultSeed, as the layers use.
func Uniform(lo, hi float64, rng *rand.Rand) Init {
	return func(_ []int, dst []float64) error {
		if !(lo <= hi) {
			return fmt.Errorf("uniform bounds %v > %v: %w", lo, hi, errs.InvalidArgument)
		}
		r := orDefault(rng)
		for i := range dst {
			dst[i] = lo + (hi-lo)*r.Float64()
		}
		return nil
	}
}

// Normal draws from N(mean, std²) with rng (torch.nn.init.normal_; std 1 is
// what nn.Embedding uses). A nil rng is a new DefaultSeed generator.
func Normal(mean, std float64, rng *rand.Rand) Init {
	return func(_ []int, dst []float64) error {
		if std < 0 {
			return fmt.Errorf("normal standard deviation %v is negative: %w", std, errs.InvalidArgument)
		}
		r := orDefault(rng)
		for i := range dst {
			dst[i] = mean + std*r.NormFloat64()
		}
		return nil
	}
}

// FanInUniform draws from U(-1/√fanIn, 1/√fanIn) with rng: PyTorch's default
// for nn.Linear's and nn.Conv2d's weight (kaiming_uniform_ with a=√5 comes to
// this bound) and bias, where fanIn is the layer's input features (times the
// kernel area for a convolution). NewLinear and NewConv2d draw their tensors
// with it, so a parameter made with it from a generator in the same state
// holds exactly the values the layer would.
func FanInUniform(fanIn int, rng *rand.Rand) Init {
	return func(_ []int, dst []float64) error {
		if fanIn <= 0 {
			return fmt.Errorf("fan-in %d must be positive: %w", fanIn, errs.InvalidArgument)
		}
		fillUniform(dst, orDefault(rng), fanInBound(fanIn))
		return nil
	}
}

// KaimingUniform draws from U(-b, b) with b = gain·√(3/fan_in) and gain =
// √(2/(1+a²)), torch.nn.init.kaiming_uniform_(a=a, mode="fan_in",
// nonlinearity="leaky_relu"); fan_in is shape[1] times the product of the
// dimensions after it. a=√5 gives nn.Linear's weight distribution (see
// FanInUniform for its exact values).
func KaimingUniform(a float64, rng *rand.Rand) Init {
	return func(shape []int, dst []float64) error {
		fanIn, _, err := fans(shape)
		if err != nil {
			return err
		}
		gain := math.Sqrt(2 / (1 + a*a))
		fillUniform(dst, orDefault(rng), math.Sqrt(3.0)*gain/math.Sqrt(float64(fanIn)))
		return nil
	}
}

// KaimingNormal draws from N(0, std²) with std = gain/√fan_in and gain =
// √(2/(1+a²)), torch.nn.init.kaiming_normal_(a=a, mode="fan_in",
// nonlinearity="leaky_relu"); a=0 is He initialisation for ReLU networks.
func KaimingNormal(a float64, rng *rand.Rand) Init {
	return func(shape []int, dst []float64) error {
		fanIn, _, err := fans(shape)
		if err != nil {
			return err
		}
		std := math.Sqrt(2/(1+a*a)) / math.Sqrt(float64(fanIn))
		return Normal(0, std, orDefault(rng))(shape, dst)
	}
}

// XavierUniform draws from U(-b, b) with b = gain·√(6/(fan_in+fan_out)),
// torch.nn.init.xavier_uniform_.
func XavierUniform(gain float64, rng *rand.Rand) Init {
	return func(shape []int, dst []float64) error {
		fanIn, fanOut, err := fans(shape)
		if err != nil {
			return err
		}
		fillUniform(dst, orDefault(rng), gain*math.Sqrt(6/float64(fanIn+fanOut)))
		return nil
	}
}

// XavierNormal draws from N(0, std²) with std = gain·√(2/(fan_in+fan_out)),
// torch.nn.init.xavier_normal_.
func XavierNormal(gain float64, rng *rand.Rand) Init {
	return func(shape []int, dst []float64) error {
		fanIn, fanOut, err := fans(shape)
		if err != nil {
			return err
		}
		return Normal(0, gain*math.Sqrt(2/float64(fanIn+fanOut)), orDefault(rng))(shape, dst)
	}
}

// fans is torch.nn.init's _calculate_fan_in_and_fan_out: for a weight of
// shape [out, in, k...], fan_in = in·∏k and fan_out = out·∏k.
func fans(shape []int) (fanIn, fanOut int, err error) {
	if len(shape) < 2 {
		return 0, 0, fmt.Errorf("fan in and fan out need a tensor of at least 2 dimensions, got shape %v: %w", shape, errs.InvalidArgument)
	}
	receptive := 1
	for _, d := range shape[2:] {
		receptive *= d
	}
	return shape[1] * receptive, shape[0] * receptive, nil
}

func orDefault(rng *rand.Rand) *rand.Rand {
	if rng == nil {
		return rand.New(rand.NewPCG(DefaultSeed, DefaultSeed))
	}
	return rng
}

// fillUniform draws U(-bound, bound) in the order and arithmetic every layer
// uses.
func fillUniform(dst []float64, rng *rand.Rand, bound float64) {
	for i := range dst {
		dst[i] = (2*rng.Float64() - 1) * bound
	}
}

// newParam allocates a named tensor of dtype dt, filled by fill (which is
// handed the values in row-major order as float64).
func newParam(name string, dt tensor.Dtype, requiresGrad bool, shape []int, fill func(i int) float64) *Param {
	t := newDense(dt, shape...)
	switch d := t.Data().(type) {
	case []float64:
		for i := range d {
			d[i] = fill(i)
		}
	case []float32:
		for i := range d {
			d[i] = float32(fill(i))
		}
	default:
		panic(fmt.Sprintf("models: newParam with unsupported dtype %v", dt))
	}
	return &Param{Name: name, Value: t, RequiresGrad: requiresGrad}
}

// uniformParam draws U(-bound, bound), PyTorch's default for Linear and Conv
// weights (kaiming_uniform_ with a=√5 gives bound = 1/√fan_in) and biases.
func uniformParam(name string, dt tensor.Dtype, rng *rand.Rand, bound float64, shape ...int) *Param {
	return newParam(name, dt, true, shape, func(int) float64 { return (2*rng.Float64() - 1) * bound })
}

// normalParam draws N(0, 1), PyTorch's default for Embedding weights.
func normalParam(name string, dt tensor.Dtype, rng *rand.Rand, shape ...int) *Param {
	return newParam(name, dt, true, shape, func(int) float64 { return rng.NormFloat64() })
}

// constParam fills with v (ones and zeros of the normalisation layers).
func constParam(name string, dt tensor.Dtype, requiresGrad bool, v float64, shape ...int) *Param {
	return newParam(name, dt, requiresGrad, shape, func(int) float64 { return v })
}

// fanInBound is 1/√fan_in, the bound of PyTorch's default uniform init.
func fanInBound(fanIn int) float64 { return 1 / math.Sqrt(float64(fanIn)) }
