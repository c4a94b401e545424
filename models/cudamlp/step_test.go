//go:build tandemcuda

package cudamlp_test

import (
	"context"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/tandemml/tandem/comm/devstage"
	"github.com/tandemml/tandem/graph"
	"github.com/tandemml/tandem/models"
	"github.com/tandemml/tandem/models/cudamlp"
	"github.com/tandemml/tandem/optim"
	"gorgonia.org/tensor"
)

// TestStepMatchesCPU trains the same MLP for 100 SGD steps on the CPU
// (models, graph, optim: the step tandem bench train times) and on GPU 0,
// from the same parameters and batches, and compares the losses at every
// step and the parameters at the end to float32 tolerance. It needs a GPU.
func TestStepMatchesCPU(t *testing.T) {
	const batch, steps, lr = 32, 100, 0.01
	sizes := []int{64, 128, 128, 10}
	rng := rand.New(rand.NewPCG(3, 4))
	model, err := models.NewMLP(sizes, models.WithRand(rng), models.WithDtype(tensor.Float32))
	if err != nil {
		t.Fatal(err)
	}
	var init []*tensor.Dense
	for _, p := range model.Params() {
		init = append(init, p.Value.Clone().(*tensor.Dense))
	}
	xs := make([]float32, batch*sizes[0])
	ys := make([]int64, batch)
	b := models.NewBuilder(nil, models.WithGradsInPlace())
	x := b.Bind("x", tensor.New(tensor.WithShape(batch, sizes[0]), tensor.WithBacking(xs)))
	y := b.Bind("y", tensor.New(tensor.WithShape(batch), tensor.WithBacking(ys)))
	logits, err := model.Forward(b, x)
	if err != nil {
		t.Fatal(err)
	}
	lossNode, err := models.CrossEntropy(logits, y)
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Backward(lossNode); err != nil {
		t.Fatal(err)
	}
	prog, err := b.Compile(graph.Workers(1))
	if err != nil {
		t.Fatal(err)
	}
	opt, err := optim.NewSGD(model.Params(), optim.LR(lr))
	if err != nil {
		t.Fatal(err)
	}

	dev, err := devstage.NewCUDA(0)
	if err != nil {
		t.Fatal(err)
	}
	defer dev.Close()
	step, err := cudamlp.New(dev, sizes, batch, init)
	if err != nil {
		t.Fatal(err)
	}
	defer step.Close()

	ctx := context.Background()
	for i := 0; i < steps; i++ {
		for j := range xs {
			xs[j] = float32(rng.NormFloat64())
		}
		for j := range ys {
			ys[j] = int64(rng.IntN(sizes[len(sizes)-1]))
		}
		opt.ZeroGrad()
		if err := prog.Run(ctx); err != nil {
			t.Fatal(err)
		}
		if err := b.CopyGrads(); err != nil {
			t.Fatal(err)
		}
		if err := opt.Step(); err != nil {
			t.Fatal(err)
		}
		cpuLoss := float64(lossNode.Value().Data().(float32))
		gpuLoss, err := step.Grads(xs, ys)
		if err != nil {
			t.Fatal(err)
		}
		if err := step.SGD(lr); err != nil {
			t.Fatal(err)
		}
		if math.Abs(gpuLoss-cpuLoss) > 1e-4*math.Max(1, math.Abs(cpuLoss)) {
			t.Fatalf("step %d: loss %v on the GPU, %v on the CPU", i, gpuLoss, cpuLoss)
		}
	}
	got, err := step.Params()
	if err != nil {
		t.Fatal(err)
	}
	for i, p := range model.Params() {
		want := p.Value.Data().([]float32)
		have := got[i].Data().([]float32)
		for j := range want {
			if d := math.Abs(float64(have[j] - want[j])); d > 1e-4 {
				t.Fatalf("parameter %s element %d after %d steps: GPU %v, CPU %v", p.Name, j, steps, have[j], want[j])
			}
		}
	}
}
