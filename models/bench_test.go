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
	m, err := NewMLP([]int{784, 1024, 1024, 10}, WithRand(rng), WithDtype(tensor.Float32))
	if err != nil {
		b.Fatal(err)
	}
	benchTrainStep(b, rng, m, []int{64, 784})
}

// BenchmarkCNNTrainStep times one training step of NewCNN's default network
// on a batch of 64 28×28 images in float32 (forward, backward, gradient copy).
func BenchmarkCNNTrainStep(b *testing.B) {
	rng := rand.New(rand.NewPCG(1, 2))
	m, err := NewCNN(CNNConfig{}, rng, WithDtype(tensor.Float32))
	if err != nil {
		b.Fatal(err)
	}
	benchTrainStep(b, rng, m, []int{64, 1, 28, 28})
}

// benchTrainStep builds m's forward pass on a random float32 batch of shape
// xShape (the batch size is xShape[0]) with random labels of 10 classes,
// a cross-entropy loss and its backward pass, and times running the graph
// under gorgonia's TapeMachine and copying out the gradients.
func benchTrainStep(b *testing.B, rng *rand.Rand, m Module, xShape []int) {
	x := newParam("x", tensor.Float32, false, xShape, func(int) float64 { return rng.Float64() }).Value
	labels := make([]int64, xShape[0])
	for i := range labels {
		labels[i] = int64(rng.IntN(10))
	}
	bl := NewBuilder(nil)
	logits, err := m.Forward(bl, bl.Bind("x", x))
	if err != nil {
		b.Fatal(err)
	}
	loss, err := CrossEntropy(logits, bl.Bind("y", tensor.New(tensor.WithShape(xShape[0]), tensor.WithBacking(labels))))
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
