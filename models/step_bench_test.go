package models_test

import (
	"context"
	"math/rand/v2"
	"runtime"
	"testing"

	"gorgonia.org/tensor"

	"github.com/tandemml/tandem/graph"
	"github.com/tandemml/tandem/internal/cputime"
	"github.com/tandemml/tandem/models"
	"github.com/tandemml/tandem/optim"
)

// stepBench is one whole training step as a user runs it on the graph
// executor: ZeroGrad, forward and backward, CopyGrads, SGD update.
type stepBench struct {
	b    *models.Builder
	prog *graph.Program
	opt  *optim.SGD
}

func newStepBench(tb testing.TB, model models.Module, xShape []int, classes int, opts ...models.BuilderOption) *stepBench {
	tb.Helper()
	rng := rand.New(rand.NewPCG(3, 4))
	x := tensor.New(tensor.Of(tensor.Float32), tensor.WithShape(xShape...))
	for i, xs := 0, x.Float32s(); i < len(xs); i++ {
		xs[i] = float32(rng.NormFloat64())
	}
	ys := make([]int64, xShape[0])
	for i := range ys {
		ys[i] = int64(rng.IntN(classes))
	}
	b := models.NewBuilder(nil, opts...)
	logits, err := model.Forward(b, b.Bind("x", x))
	if err != nil {
		tb.Fatal(err)
	}
	loss, err := models.CrossEntropy(logits, b.Bind("y", tensor.New(tensor.WithShape(len(ys)), tensor.WithBacking(ys))))
	if err != nil {
		tb.Fatal(err)
	}
	if err := b.Backward(loss); err != nil {
		tb.Fatal(err)
	}
	prog, err := b.Compile(graph.Workers(1))
	if err != nil {
		tb.Fatal(err)
	}
	opt, err := optim.NewSGD(model.Params(), optim.LR(0.01))
	if err != nil {
		tb.Fatal(err)
	}
	return &stepBench{b: b, prog: prog, opt: opt}
}

func (s *stepBench) step(tb testing.TB, update bool) {
	if update {
		s.opt.ZeroGrad()
	}
	if err := s.prog.Run(context.Background()); err != nil {
		tb.Fatal(err)
	}
	if err := s.b.CopyGrads(); err != nil {
		tb.Fatal(err)
	}
	if update {
		if err := s.opt.Step(); err != nil {
			tb.Fatal(err)
		}
	}
}

func runStepBench(b *testing.B, model models.Module, xShape []int, classes int, update bool, opts ...models.BuilderOption) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	s := newStepBench(b, model, xShape, classes, opts...)
	for range 3 {
		s.step(b, update)
	}
	b.ReportAllocs()
	cpu0 := cputime.Process()
	for b.Loop() {
		s.step(b, update)
	}
	// CPU time is what a step costs when other processes compete for the
	// cores (wall time then includes waiting for one).
	if cpu := cputime.Process() - cpu0; cpu > 0 {
		b.ReportMetric(float64(cpu.Microseconds())/1e3/float64(b.N), "cpu-ms/op")
	}
}

// BenchmarkMLPStep is `tandem bench train`'s step: MLP 784-1024-1024-10,
// batch 64, float32, one core, graph executor, ZeroGrad + forward +
// backward + CopyGrads + optim.SGD.
func BenchmarkMLPStep(b *testing.B) {
	m, err := models.NewMLP([]int{784, 1024, 1024, 10}, models.WithRand(rand.New(rand.NewPCG(0, 1))), models.WithDtype(tensor.Float32))
	if err != nil {
		b.Fatal(err)
	}
	runStepBench(b, m, []int{64, 784}, 10, true)
}

// BenchmarkMLPStepInPlace is BenchmarkMLPStep with models.WithGradsInPlace:
// the run writes the gradients into Param.Grad and CopyGrads copies nothing.
func BenchmarkMLPStepInPlace(b *testing.B) {
	m, err := models.NewMLP([]int{784, 1024, 1024, 10}, models.WithRand(rand.New(rand.NewPCG(0, 1))), models.WithDtype(tensor.Float32))
	if err != nil {
		b.Fatal(err)
	}
	runStepBench(b, m, []int{64, 784}, 10, true, models.WithGradsInPlace())
}

// BenchmarkMLPStepNoOptim is BenchmarkMLPStep without ZeroGrad and the SGD
// update: the part of the step this package is responsible for.
func BenchmarkMLPStepNoOptim(b *testing.B) {
	m, err := models.NewMLP([]int{784, 1024, 1024, 10}, models.WithRand(rand.New(rand.NewPCG(0, 1))), models.WithDtype(tensor.Float32))
	if err != nil {
		b.Fatal(err)
	}
	runStepBench(b, m, []int{64, 784}, 10, false)
}

// BenchmarkCNNStep is NewCNN's default network (28×28 inputs) at batch 64,
// float32, one core, graph executor, with the SGD update.
func BenchmarkCNNStep(b *testing.B) {
	m, err := models.NewCNN(models.CNNConfig{}, rand.New(rand.NewPCG(0, 1)), models.WithDtype(tensor.Float32))
	if err != nil {
		b.Fatal(err)
	}
	runStepBench(b, m, []int{64, 1, 28, 28}, 10, true)
}
