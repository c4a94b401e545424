package autograd

import (
	"context"
	"math"
	"math/rand/v2"
	"testing"
	"time"

	G "gorgonia.org/gorgonia"
	"gorgonia.org/tensor"

	"github.com/tandemml/tandem/internal/rpctest"
	"github.com/tandemml/tandem/models"
	"github.com/tandemml/tandem/rpc"
)

// startGroup starts n agents with rpctest.StartGroup, with distributed
// autograd installed, each with a default call timeout of 20 s unless opts
// set another.
func startGroup(t testing.TB, n int, setup func(reg *rpc.Registry), opts ...rpc.Option) []*rpc.Agent {
	t.Helper()
	return rpctest.StartGroup(t, n, setup, append([]rpc.Option{rpc.WithDefaultTimeout(20 * time.Second), rpc.WithExtensions(Extension())}, opts...)...)
}

// noContexts waits until no agent holds a part of any context.
func noContexts(t *testing.T, agents []*rpc.Agent) {
	t.Helper()
	rpctest.Eventually(t, "every context is released", func() bool {
		for _, a := range agents {
			if len(Contexts(a)) != 0 {
				return false
			}
		}
		return true
	})
}

func randDense(rng *rand.Rand, shape ...int) *tensor.Dense {
	n := 1
	for _, s := range shape {
		n *= s
	}
	d := make([]float64, n)
	for i := range d {
		d[i] = rng.NormFloat64()
	}
	return tensor.New(tensor.WithShape(shape...), tensor.WithBacking(d))
}

// stageConfig builds Linear(In, Out) followed by Tanh when Tanh is set, with
// weights drawn from a generator seeded with Seed.
type stageConfig struct {
	In, Out int
	Tanh    bool
	Seed    uint64
}

func newStage(cfg stageConfig) (*models.Sequential, error) {
	lin, err := models.NewLinear(cfg.In, cfg.Out, models.WithRand(rand.New(rand.NewPCG(cfg.Seed, 7))), models.WithDtype(tensor.Float64))
	if err != nil {
		return nil, err
	}
	if !cfg.Tanh {
		return models.NewSequential(lin), nil
	}
	act, err := models.NewActivation(models.ActTanh)
	if err != nil {
		return nil, err
	}
	return models.NewSequential(lin, act), nil
}

func registerStage(reg *rpc.Registry) {
	if err := RegisterModule(reg, "stage.new", func(ctx context.Context, cfg stageConfig) (models.Module, error) {
		return newStage(cfg)
	}); err != nil {
		panic(err)
	}
}

// mseFunction is the driver's loss: MSE(prediction, target).
func mseFunction() *Function {
	return NewFunction("mse", func(b *models.Builder, in []*G.Node) ([]*G.Node, error) {
		l, err := models.MSE(in[0], in[1])
		return []*G.Node{l}, err
	})
}

func maxAbsDiff(t *testing.T, a, b *tensor.Dense) float64 {
	t.Helper()
	x, y := a.Float64s(), b.Float64s()
	if len(x) != len(y) {
		t.Fatalf("sizes differ: %v and %v", a.Shape(), b.Shape())
	}
	m := 0.0
	for i := range x {
		m = math.Max(m, math.Abs(x[i]-y[i]))
	}
	return m
}

// runBackward adds the backward pass of loss to b's graph and runs the
// whole graph once on a tape machine.
func runBackward(t *testing.T, b *models.Builder, loss *G.Node) {
	t.Helper()
	if err := b.Backward(loss); err != nil {
		t.Fatal(err)
	}
	vm := G.NewTapeMachine(b.Graph())
	defer vm.Close()
	if err := vm.RunAll(); err != nil {
		t.Fatal(err)
	}
}

// referenceGrads computes, in one gorgonia graph, the loss and the
// gradients of build's scalar output with respect to params.
func referenceGrads(t *testing.T, build func(b *models.Builder) (*G.Node, error)) (float64, map[*models.Param]*tensor.Dense) {
	t.Helper()
	b := models.NewBuilder(nil)
	loss, err := build(b)
	if err != nil {
		t.Fatal(err)
	}
	runBackward(t, b, loss)
	out := map[*models.Param]*tensor.Dense{}
	for _, p := range b.GradParams() {
		g, err := valueDense(b.GradNode(p).Value(), p.Value.Shape())
		if err != nil {
			t.Fatal(err)
		}
		out[p] = g
	}
	lv, err := valueDense(loss.Value(), tensor.Shape{})
	if err != nil {
		t.Fatal(err)
	}
	return lv.Float64s()[0], out
}
