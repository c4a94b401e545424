package autograd

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"runtime"
	"sync"
	"testing"
	"time"

	G "gorgonia.org/gorgonia"
	"gorgonia.org/tensor"

	"github.com/tandemml/tandem/comm/store"
	"github.com/tandemml/tandem/models"
	"github.com/tandemml/tandem/rpc"
)

// startGroup starts n agents in this process over loopback sockets, meeting
// through an in-memory store; setup registers functions in the shared
// registry before Init.
func startGroup(t testing.TB, n int, setup func(reg *rpc.Registry), opts ...rpc.Option) []*rpc.Agent {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	st := store.NewMemory()
	reg := rpc.NewRegistry()
	if setup != nil {
		setup(reg)
	}
	agents := make([]*rpc.Agent, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for r := 0; r < n; r++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			o := append([]rpc.Option{rpc.WithStore(st), rpc.WithRegistry(reg), rpc.WithListenAddr("127.0.0.1:0"), rpc.WithDefaultTimeout(20 * time.Second)}, opts...)
			agents[r], errs[r] = rpc.Init(ctx, fmt.Sprintf("w%d", r), r, n, o...)
		}()
	}
	wg.Wait()
	for r, err := range errs {
		if err != nil {
			t.Fatalf("Init rank %d: %v", r, err)
		}
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		var wg sync.WaitGroup
		for _, a := range agents {
			wg.Add(1)
			go func() {
				defer wg.Done()
				a.Shutdown(ctx, false)
			}()
		}
		wg.Wait()
		st.Close()
	})
	return agents
}

// eventually polls cond until it holds or 10 s pass.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting until %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// noContexts waits until no agent holds a part of any context.
func noContexts(t *testing.T, agents []*rpc.Agent) {
	t.Helper()
	eventually(t, "every context is released", func() bool {
		for _, a := range agents {
			if len(Contexts(a)) != 0 {
				return false
			}
		}
		return true
	})
}

// checkGoroutines fails if the goroutine count does not come back to about
// before within a grace period.
func checkGoroutines(t *testing.T, before int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		n := runtime.NumGoroutine()
		if n <= before+2 {
			return
		}
		if time.Now().After(deadline) {
			buf := make([]byte, 1<<20)
			buf = buf[:runtime.Stack(buf, true)]
			t.Fatalf("goroutines: %d before, %d after\n%s", before, n, buf)
		}
		time.Sleep(20 * time.Millisecond)
	}
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

// referenceGrads computes, in one gorgonia graph, the loss and the
// gradients of build's scalar output with respect to params.
func referenceGrads(t *testing.T, build func(b *models.Builder) (*G.Node, error)) (float64, map[*models.Param]*tensor.Dense) {
	t.Helper()
	b := models.NewBuilder(nil)
	loss, err := build(b)
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Backward(loss); err != nil {
		t.Fatal(err)
	}
	vm := G.NewTapeMachine(b.Graph())
	defer vm.Close()
	if err := vm.RunAll(); err != nil {
		t.Fatal(err)
	}
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
