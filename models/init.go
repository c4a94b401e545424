package models

import (
	"fmt"
	"math"
	"math/rand/v2"

	"gorgonia.org/tensor"
)

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
