package autograd

import (
	"context"
	"math/rand/v2"
	"testing"
	"time"

	G "gorgonia.org/gorgonia"

	"github.com/tandemml/tandem/models"
)

// A chain of local Functions in a context gives the same gradients as one
// gorgonia graph of the whole computation, and the gradient of a leaf
// marked with RequireGrad.
func TestLocalFunctionsMatchOneGraph(t *testing.T) {
	agents := startGroup(t, 1, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	rng := rand.New(rand.NewPCG(3, 4))
	s1, err := newStage(stageConfig{In: 3, Out: 5, Tanh: true, Seed: 1})
	if err != nil {
		t.Fatal(err)
	}
	s2, err := newStage(stageConfig{In: 5, Out: 2, Seed: 2})
	if err != nil {
		t.Fatal(err)
	}
	x, target := randDense(rng, 4, 3), randDense(rng, 4, 2)

	// the same computation, in one graph
	refLoss, refGrads := referenceGrads(t, func(b *models.Builder) (*G.Node, error) {
		xn, tn := b.Bind("x", x), b.Bind("t", target)
		h, err := s1.Forward(b, xn)
		if err != nil {
			return nil, err
		}
		y, err := s2.Forward(b, h)
		if err != nil {
			return nil, err
		}
		return models.MSE(y, tn)
	})

	f1, f2, loss := NewModuleFunction("s1", s1), NewModuleFunction("s2", s2), mseFunction()
	err = WithContext(ctx, agents[0], func(ctx context.Context, c *Context) error {
		if err := c.RequireGrad(x); err != nil {
			return err
		}
		h, err := f1.Apply(ctx, c, x)
		if err != nil {
			return err
		}
		y, err := f2.Apply(ctx, c, h[0])
		if err != nil {
			return err
		}
		l, err := loss.Apply(ctx, c, y[0], target)
		if err != nil {
			return err
		}
		if got := l[0].Float64s()[0]; got != refLoss {
			t.Errorf("loss %v, one graph %v", got, refLoss)
		}
		if err := c.Backward(ctx, l[0]); err != nil {
			return err
		}
		grads := c.Gradients()
		if len(grads) != 4 {
			t.Errorf("%d parameter gradients, want 4", len(grads))
		}
		for p, want := range refGrads {
			got := grads[p]
			if got == nil {
				t.Errorf("no gradient for %s", p.Name)
				continue
			}
			if d := maxAbsDiff(t, got, want); d > 1e-14 {
				t.Errorf("gradient of %s differs by %g", p.Name, d)
			}
			if p.Grad != nil {
				t.Errorf("Param.Grad of %s was written", p.Name)
			}
		}
		if c.Grad(x) == nil {
			t.Errorf("no gradient for the RequireGrad leaf")
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	noContexts(t, agents)
}
