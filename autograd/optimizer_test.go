package autograd

import (
	"context"
	"math/rand/v2"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tandemml/tandem/models"
	"github.com/tandemml/tandem/optim"
	"github.com/tandemml/tandem/rref"
)

var customBuilt atomic.Int32

func init() {
	RegisterOptimizer("test-adam", func(params []*models.Param, settings map[string]any) (optim.Optimizer, error) {
		customBuilt.Add(1)
		return optim.New("adam", params, settings)
	})
}

// A distributed optimizer over parameters on the driver itself and on
// another worker (Adam, through a registered constructor) matches the same
// training in one process; a step on an ended context fails clearly.
func TestDistributedOptimizer(t *testing.T) {
	agents := startGroup(t, 2, registerStage)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cfg0, cfg1 := stageConfig{In: 3, Out: 4, Tanh: true, Seed: 41}, stageConfig{In: 4, Out: 2, Seed: 42}
	rng := rand.New(rand.NewPCG(1, 2))
	x, target := randDense(rng, 5, 3), randDense(rng, 5, 2)
	const steps = 4
	settings := map[string]any{"lr": 0.01, "betas": []any{0.8, 0.99}, "weight_decay": 0.01}

	// one process
	r0, _ := newStage(cfg0)
	r1, _ := newStage(cfg1)
	refParams := append(r0.Params(), r1.Params()...)
	refOpt, err := optim.New("adam", refParams, settings)
	if err != nil {
		t.Fatal(err)
	}
	for range steps {
		refOpt.ZeroGrad()
		b := models.NewBuilder(nil)
		h, _ := r0.Forward(b, b.Bind("x", x))
		y, _ := r1.Forward(b, h)
		l, _ := models.MSE(y, b.Bind("t", target))
		runBackward(t, b, l)
		if err := b.CopyGrads(); err != nil {
			t.Fatal(err)
		}
		if err := refOpt.Step(); err != nil {
			t.Fatal(err)
		}
	}

	// stage 0 on the driver (a local Function), stage 1 on w1
	s0, _ := newStage(cfg0)
	f0 := NewModuleFunction("s0", s0)
	s1, err := NewRemoteModule(ctx, agents[0], "w1", "stage.new", cfg1)
	if err != nil {
		t.Fatal(err)
	}
	defer s1.Close(ctx)
	var refs []*rref.RRef[*models.Param]
	for _, p := range s0.Params() {
		ref, err := rref.LocalRRef(agents[0], p)
		if err != nil {
			t.Fatal(err)
		}
		refs = append(refs, ref)
	}
	remote, err := s1.ParameterRRefs(ctx)
	if err != nil {
		t.Fatal(err)
	}
	refs = append(refs, remote...)
	defer func() {
		for _, r := range remote {
			r.Release(ctx)
		}
	}()
	built := customBuilt.Load()
	opt, err := NewDistributedOptimizer(ctx, agents[0], "test-adam", settings, refs)
	if err != nil {
		t.Fatal(err)
	}
	defer opt.Close(ctx)
	if n := customBuilt.Load() - built; n != 2 {
		t.Errorf("the registered constructor ran %d times, want 2 (one per worker)", n)
	}
	if ws := opt.Workers(); len(ws) != 2 {
		t.Errorf("optimizer workers %v", ws)
	}
	lossFn := mseFunction()
	var last ContextID
	for range steps {
		err := WithContext(ctx, agents[0], func(ctx context.Context, c *Context) error {
			last = c.ID()
			h, err := f0.Apply(ctx, c, x)
			if err != nil {
				return err
			}
			y, err := s1.Forward(ctx, c, h[0])
			if err != nil {
				return err
			}
			l, err := lossFn.Apply(ctx, c, y, target)
			if err != nil {
				return err
			}
			if err := c.Backward(ctx, l[0]); err != nil {
				return err
			}
			return opt.Step(ctx, c.ID())
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	for i, r := range refs {
		p, err := r.ToHere(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if d := maxAbsDiff(t, p.Value, refParams[i].Value); d > 1e-10 {
			t.Errorf("parameter %d (%s) differs from one process by %g", i, p.Name, d)
		}
	}
	err = opt.Step(ctx, last)
	if err == nil || !strings.Contains(err.Error(), "no part of context") {
		t.Errorf("Step on an ended context: %v", err)
	}
}
