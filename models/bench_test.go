package models

import (
	"math/rand/v2"
	"testing"

	G "gorgonia.org/gorgonia"
	"gorgonia.org/tensor"
)

// BenchmarkMLPTrainStep times one training step (forward, backward,
// gradient copy) of an MLP 784-1024-1024-10 on a batch of 64 in float32
// under gorgonia's TapeMachine; the optimizer update is not included.
func BenchmarkMLPTrainStep(b *testing.B) {
	rng := rand.New(rand.NewPCG(1, 2))
	m, err := NewMLP([]int{784, 1024, 1024, 10}, ActReLU, true, rng, WithDtype(tensor.Float32))
	if err != nil {
		b.Fatal(err)
	}
	x := newParam("x", tensor.Float32, false, []int{64, 784}, func(int) float64 { return rng.Float64() }).Value
	labels := make([]int64, 64)
	for i := range labels {
		labels[i] = int64(rng.IntN(10))
	}
	bl := NewBuilder(nil)
	logits, err := m.Forward(bl, bl.Bind("x", x))
	if err != nil {
		b.Fatal(err)
	}
	loss, err := CrossEntropy(logits, bl.Bind("y", tensor.New(tensor.WithShape(64), tensor.WithBacking(labels))))
	if err != nil {
		b.Fatal(err)
	}
	if err := bl.Backward(loss); err != nil {
		b.Fatal(err)
	}
	vm := G.NewTapeMachine(bl.Graph())
	defer vm.Close()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		vm.Reset()
		if err := vm.RunAll(); err != nil {
			b.Fatal(err)
		}
		if err := bl.CopyGrads(); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkCNNTrainStep times one training step of NewCNN's default network
// on a batch of 64 28×28 images in float32 (forward, backward, gradient copy).
func BenchmarkCNNTrainStep(b *testing.B) {
	rng := rand.New(rand.NewPCG(1, 2))
	m, err := NewCNN(CNNConfig{}, rng, WithDtype(tensor.Float32))
	if err != nil {
		b.Fatal(err)
	}
	x := newParam("x", tensor.Float32, false, []int{64, 1, 28, 28}, func(int) float64 { return rng.Float64() }).Value
	labels := make([]int64, 64)
	for i := range labels {
		labels[i] = int64(rng.IntN(10))
	}
	bl := NewBuilder(nil)
	logits, err := m.Forward(bl, bl.Bind("x", x))
	if err != nil {
		b.Fatal(err)
	}
	loss, err := CrossEntropy(logits, bl.Bind("y", tensor.New(tensor.WithShape(64), tensor.WithBacking(labels))))
	if err != nil {
		b.Fatal(err)
	}
	if err := bl.Backward(loss); err != nil {
		b.Fatal(err)
	}
	vm := G.NewTapeMachine(bl.Graph())
	defer vm.Close()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		vm.Reset()
		if err := vm.RunAll(); err != nil {
			b.Fatal(err)
		}
		if err := bl.CopyGrads(); err != nil {
			b.Fatal(err)
		}
	}
}
