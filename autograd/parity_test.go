package autograd

import (
	"context"
	"math/rand/v2"
	"testing"
	"time"

	G "gorgonia.org/gorgonia"
	"gorgonia.org/tensor"

	"github.com/tandemml/tandem/models"
	"github.com/tandemml/tandem/optim"
)

// A model split in two stages on two workers, driven by a third that
// computes the loss, trained with distributed autograd and a distributed
// SGD with momentum, ends with the weights of the same model trained in one
// process. Each step runs two micro-batches (gradients add up in the
// context over two backward passes).
func TestParityWithOneProcess(t *testing.T) {
	agents := startGroup(t, 3, registerStage)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	driver := agents[0]
	cfg1 := stageConfig{In: 4, Out: 6, Tanh: true, Seed: 11}
	cfg2 := stageConfig{In: 6, Out: 3, Seed: 12}
	const (
		steps = 5
		lr    = 0.1
		mom   = 0.9
	)
	rng := rand.New(rand.NewPCG(5, 6))
	var xs, ts [steps][2]*tensor.Dense
	for s := range steps {
		for m := range 2 {
			xs[s][m], ts[s][m] = randDense(rng, 5, 4), randDense(rng, 5, 3)
		}
	}

	// One process: the same two stages in one graph per micro-batch.
	ref1, _ := newStage(cfg1)
	ref2, _ := newStage(cfg2)
	refParams := append(ref1.Params(), ref2.Params()...)
	refOpt, err := optim.NewSGD(refParams, optim.LR(lr), optim.Momentum(mom))
	if err != nil {
		t.Fatal(err)
	}
	for s := range steps {
		refOpt.ZeroGrad()
		for m := range 2 {
			b := models.NewBuilder(nil)
			h, err := ref1.Forward(b, b.Bind("x", xs[s][m]))
			if err != nil {
				t.Fatal(err)
			}
			y, err := ref2.Forward(b, h)
			if err != nil {
				t.Fatal(err)
			}
			loss, err := models.MSE(y, b.Bind("t", ts[s][m]))
			if err != nil {
				t.Fatal(err)
			}
			if err := b.Backward(loss); err != nil {
				t.Fatal(err)
			}
			vm := G.NewTapeMachine(b.Graph())
			if err := vm.RunAll(); err != nil {
				t.Fatal(err)
			}
			vm.Close()
			if err := b.AccumulateGrads(); err != nil {
				t.Fatal(err)
			}
		}
		if err := refOpt.Step(); err != nil {
			t.Fatal(err)
		}
	}

	// Distributed: stage 1 on w1, stage 2 on w2, the loss on w0.
	stage1, err := NewRemoteModule(ctx, driver, "w1", "stage.new", cfg1)
	if err != nil {
		t.Fatal(err)
	}
	defer stage1.Close(ctx)
	stage2, err := NewRemoteModule(ctx, driver, "w2", "stage.new", cfg2)
	if err != nil {
		t.Fatal(err)
	}
	defer stage2.Close(ctx)
	p1, err := stage1.ParameterRRefs(ctx)
	if err != nil {
		t.Fatal(err)
	}
	p2, err := stage2.ParameterRRefs(ctx)
	if err != nil {
		t.Fatal(err)
	}
	refs := append(p1, p2...)
	defer func() {
		for _, r := range refs {
			r.Release(ctx)
		}
	}()
	opt, err := NewDistributedOptimizer(ctx, driver, "sgd", map[string]any{"lr": lr, "momentum": mom}, refs)
	if err != nil {
		t.Fatal(err)
	}
	defer opt.Close(ctx)
	lossFn := mseFunction()
	for s := range steps {
		err := WithContext(ctx, driver, func(ctx context.Context, c *Context) error {
			for m := range 2 {
				h, err := stage1.Forward(ctx, c, xs[s][m])
				if err != nil {
					return err
				}
				y, err := stage2.Forward(ctx, c, h)
				if err != nil {
					return err
				}
				l, err := lossFn.Apply(ctx, c, y, ts[s][m])
				if err != nil {
					return err
				}
				if err := c.Backward(ctx, l[0]); err != nil {
					return err
				}
			}
			if got := c.Workers(); len(got) != 3 {
				t.Errorf("context workers %v, want all three", got)
			}
			return opt.Step(ctx, c.ID())
		})
		if err != nil {
			t.Fatalf("step %d: %v", s, err)
		}
	}
	noContexts(t, agents)

	// Compare the weights, fetched from their owners.
	for i, r := range refs {
		p, err := r.ToHere(ctx)
		if err != nil {
			t.Fatal(err)
		}
		want := refParams[i]
		if p.Name != want.Name {
			t.Fatalf("parameter %d is %q, want %q", i, p.Name, want.Name)
		}
		if d := maxAbsDiff(t, p.Value, want.Value); d > 1e-10 {
			t.Errorf("%s (parameter %d) differs from one-process training by %g", p.Name, i, d)
		}
		if p.Grad != nil {
			t.Errorf("Param.Grad of %s was left set on its worker", p.Name)
		}
	}
	// The weights moved: training did something.
	init1, _ := newStage(cfg1)
	p, _ := refs[0].ToHere(ctx)
	if d := maxAbsDiff(t, p.Value, init1.Params()[0].Value); d < 1e-3 {
		t.Errorf("weights barely moved (%g)", d)
	}
}
