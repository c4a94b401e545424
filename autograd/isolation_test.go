package autograd

import (
	"context"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"gorgonia.org/tensor"

	"github.com/tandemml/tandem/models"
)

// Contexts running at the same time over the same remote modules keep
// their gradients apart: each ends with exactly the gradients it has when
// run alone, and Param.Grad is never touched.
func TestConcurrentContextsAreIsolated(t *testing.T) {
	agents := startGroup(t, 3, registerStage)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	stage1, err := NewRemoteModule(ctx, agents[0], "w1", "stage.new", stageConfig{In: 3, Out: 5, Tanh: true, Seed: 31})
	if err != nil {
		t.Fatal(err)
	}
	defer stage1.Close(ctx)
	stage2, err := NewRemoteModule(ctx, agents[0], "w2", "stage.new", stageConfig{In: 5, Out: 2, Seed: 32})
	if err != nil {
		t.Fatal(err)
	}
	defer stage2.Close(ctx)
	lossFn := mseFunction()
	const n = 4
	rng := rand.New(rand.NewPCG(9, 9))
	var xs, ts [n]*tensor.Dense
	for i := range n {
		xs[i], ts[i] = randDense(rng, 3, 3), randDense(rng, 3, 2)
	}
	// run does one forward and backward pass for input i and returns the
	// gradients on workers 1 and 2, by parameter name.
	run := func(i int) ([2]map[string]*tensor.Dense, error) {
		var out [2]map[string]*tensor.Dense
		err := WithContext(ctx, agents[0], func(ctx context.Context, c *Context) error {
			h, err := stage1.Forward(ctx, c, xs[i])
			if err != nil {
				return err
			}
			y, err := stage2.Forward(ctx, c, h)
			if err != nil {
				return err
			}
			l, err := lossFn.Apply(ctx, c, y, ts[i])
			if err != nil {
				return err
			}
			if err := c.Backward(ctx, l[0]); err != nil {
				return err
			}
			for w := 1; w <= 2; w++ {
				g, err := GetGradients(agents[w], c.ID())
				if err != nil {
					return err
				}
				out[w-1] = byName(g)
			}
			return nil
		})
		return out, err
	}
	var alone [n][2]map[string]*tensor.Dense
	for i := range n {
		if alone[i], err = run(i); err != nil {
			t.Fatal(err)
		}
	}
	for round := 0; round < 3; round++ {
		var together [n][2]map[string]*tensor.Dense
		errs := make([]error, n)
		var wg sync.WaitGroup
		for i := range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				together[i], errs[i] = run(i)
			}()
		}
		wg.Wait()
		for i := range n {
			if errs[i] != nil {
				t.Fatalf("context %d: %v", i, errs[i])
			}
			for w := range 2 {
				if len(together[i][w]) != len(alone[i][w]) || len(alone[i][w]) != 2 {
					t.Fatalf("context %d, worker %d: %d gradients, alone %d", i, w+1, len(together[i][w]), len(alone[i][w]))
				}
				for name, g := range alone[i][w] {
					if d := maxAbsDiff(t, together[i][w][name], g); d != 0 {
						t.Errorf("round %d, context %d, worker %d: gradient of %s differs by %g from the context run alone", round, i, w+1, name, d)
					}
				}
			}
		}
	}
	noContexts(t, agents)
	names, err := stage1.ParamNames(ctx)
	if err != nil || len(names) != 2 {
		t.Fatalf("ParamNames: %v %v", names, err)
	}
	refs, err := stage1.ParameterRRefs(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range refs {
		p, err := r.ToHere(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if p.Grad != nil {
			t.Errorf("Param.Grad of %s was written", p.Name)
		}
		r.Release(ctx)
	}
}

func byName(g map[*models.Param]*tensor.Dense) map[string]*tensor.Dense {
	out := map[string]*tensor.Dense{}
	for p, t := range g {
		out[p.Name] = t
	}
	return out
}
