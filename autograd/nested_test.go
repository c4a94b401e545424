package autograd

import (
	"context"
	"errors"
	"math/rand/v2"
	"testing"
	"time"

	G "gorgonia.org/gorgonia"
	"gorgonia.org/tensor"

	"github.com/tandemml/tandem/models"
	"github.com/tandemml/tandem/rpc"
)

// A handler that calls another worker with what it received: the graph
// spans the chain driver -> w1 -> w2 -> w1 -> driver, the owner learns of
// w2 from w1's reply, and gradients flow back along the chain.
func TestNestedCalls(t *testing.T) {
	lin, err := newStage(stageConfig{In: 3, Out: 2, Tanh: true, Seed: 61})
	if err != nil {
		t.Fatal(err)
	}
	linFn := NewModuleFunction("lin", lin)
	agents := startGroup(t, 3, func(reg *rpc.Registry) {
		must(t, rpc.Register(reg, "lin", func(ctx context.Context, x *tensor.Dense) (*tensor.Dense, error) {
			out, err := linFn.Apply(ctx, FromContext(ctx), x)
			if err != nil {
				return nil, err
			}
			return out[0], nil
		}))
		must(t, rpc.Register(reg, "relay", func(ctx context.Context, x *tensor.Dense) (*tensor.Dense, error) {
			return rpc.Sync[*tensor.Dense](ctx, rpc.AgentFromContext(ctx), "w2", "lin", x)
		}))
		must(t, rpc.Register(reg, "relay.fail", func(ctx context.Context, x *tensor.Dense) (*tensor.Dense, error) {
			if _, err := rpc.Sync[*tensor.Dense](ctx, rpc.AgentFromContext(ctx), "w2", "lin", x); err != nil {
				return nil, err
			}
			return nil, errors.New("relay gave up")
		}))
	})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	rng := rand.New(rand.NewPCG(6, 1))
	x, target := randDense(rng, 4, 3), randDense(rng, 4, 2)
	_, want := referenceGrads(t, func(b *models.Builder) (*G.Node, error) {
		y, err := lin.Forward(b, b.Bind("x", x))
		if err != nil {
			return nil, err
		}
		return models.MSE(y, b.Bind("t", target))
	})
	lossFn := mseFunction()
	err = WithContext(ctx, agents[0], func(ctx context.Context, c *Context) error {
		if err := c.RequireGrad(x); err != nil {
			return err
		}
		y, err := rpc.Sync[*tensor.Dense](ctx, agents[0], "w1", "relay", x)
		if err != nil {
			return err
		}
		l, err := lossFn.Apply(ctx, c, y, target)
		if err != nil {
			return err
		}
		if ws := c.Workers(); len(ws) != 3 {
			t.Errorf("the owner knows workers %v; want all three", ws)
		}
		if err := c.Backward(ctx, l[0]); err != nil {
			return err
		}
		got, err := GetGradients(agents[2], c.ID())
		if err != nil {
			return err
		}
		for p, g := range got {
			if d := maxAbsDiff(t, g, want[p]); d > 1e-14 {
				t.Errorf("gradient of %s differs by %g", p.Name, d)
			}
		}
		if len(got) != 2 || c.Grad(x) == nil {
			t.Errorf("%d gradients on w2, gradient of x %v", len(got), c.Grad(x))
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	noContexts(t, agents)

	// The relay fails after reaching w2: its error reply tells the owner
	// nothing of w2, yet ending the context releases w2's part too (w1
	// passes the release on).
	err = WithContext(ctx, agents[0], func(ctx context.Context, c *Context) error {
		if err := c.RequireGrad(x); err != nil {
			return err
		}
		_, err := rpc.Sync[*tensor.Dense](ctx, agents[0], "w1", "relay.fail", x)
		if !errors.Is(err, rpc.ErrRemote) {
			t.Errorf("relay.fail: %v", err)
		}
		if n := len(Contexts(agents[2])); n != 1 {
			t.Errorf("w2 holds %d contexts during the step, want 1", n)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	noContexts(t, agents)
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
