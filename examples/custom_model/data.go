package main

import (
	"math"
	"math/rand/v2"

	"gorgonia.org/tensor"

	"github.com/tandemml/tandem/data"
)

// makeData draws n examples of the task the program learns: a user's
// features u (userDim of them) and an item's v (itemDim), both standard
// normal, and a float target, how much the user likes the item:
//
//	target = tanh(u·P·vᵀ) + 0.3·u₀·v₁ + noise
//
// with P a fixed matrix and noise of standard deviation 0.05. The same seed
// gives the same examples in every process, so every rank holds the whole
// data set and the DistributedSampler deals out the indices.
func makeData(n int, seed uint64, dt tensor.Dtype) (*data.TensorDataset, error) {
	hidden := rand.New(rand.NewPCG(7, 7)) // the task itself: the same for every seed
	var p [userDim][itemDim]float64
	for i := range p {
		for j := range p[i] {
			p[i][j] = hidden.NormFloat64() / 2
		}
	}
	rng := rand.New(rand.NewPCG(seed, 11))
	user := make([]float64, n*userDim)
	item := make([]float64, n*itemDim)
	target := make([]float64, n)
	for k := range n {
		u, v := user[k*userDim:(k+1)*userDim], item[k*itemDim:(k+1)*itemDim]
		for i := range u {
			u[i] = rng.NormFloat64()
		}
		for j := range v {
			v[j] = rng.NormFloat64()
		}
		s := 0.0
		for i := range u {
			for j := range v {
				s += u[i] * p[i][j] * v[j]
			}
		}
		target[k] = math.Tanh(s) + 0.3*u[0]*v[1] + 0.05*rng.NormFloat64()
	}
	return data.NewTensorDataset([]string{"user", "item", "target"},
		dense(user, dt, n, userDim), dense(item, dt, n, itemDim), dense(target, dt, n))
}

// dense makes a tensor of dtype dt (float32 or float64) from v.
func dense(v []float64, dt tensor.Dtype, shape ...int) *tensor.Dense {
	if dt == tensor.Float32 {
		f := make([]float32, len(v))
		for i, x := range v {
			f[i] = float32(x)
		}
		return tensor.New(tensor.WithShape(shape...), tensor.WithBacking(f))
	}
	return tensor.New(tensor.WithShape(shape...), tensor.WithBacking(v))
}
