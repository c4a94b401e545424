package autograd

import (
	"context"
	"math/rand/v2"
	"testing"
	"time"

	G "gorgonia.org/gorgonia"
	"gorgonia.org/tensor"

	"github.com/tandemml/tandem/models"
	"github.com/tandemml/tandem/rpc"
)

type pairArg struct {
	A, B  *tensor.Dense // A tracked, B a constant
	Scale float64
}

type pairOut struct {
	Prod  *tensor.Dense
	Named map[string]*tensor.Dense
}

// Arguments and results that are structs and maps carrying tracked and
// untracked tensors side by side get exact gradients.
func TestStructMessages(t *testing.T) {
	pair := NewFunction("pair", func(b *models.Builder, in []*G.Node) ([]*G.Node, error) {
		p, err := G.HadamardProd(in[0], in[1])
		if err != nil {
			return nil, err
		}
		th, err := G.Tanh(in[0])
		return []*G.Node{p, th}, err
	})
	agents := startGroup(t, 3, func(reg *rpc.Registry) {
		registerStage(reg)
		if err := rpc.Register(reg, "pair", func(ctx context.Context, arg pairArg) (pairOut, error) {
			outs, err := pair.Apply(ctx, FromContext(ctx), arg.A, arg.B)
			if err != nil {
				return pairOut{}, err
			}
			return pairOut{Prod: outs[0], Named: map[string]*tensor.Dense{"tanh": outs[1], "const": arg.B}}, nil
		}); err != nil {
			t.Fatal(err)
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	cfg := stageConfig{In: 3, Out: 4, Tanh: true, Seed: 51}
	rng := rand.New(rand.NewPCG(5, 5))
	x, bconst := randDense(rng, 2, 3), randDense(rng, 2, 4)
	lossOf := func(b *models.Builder, p, th, k *G.Node) (*G.Node, error) {
		pp, err := G.HadamardProd(p, p)
		if err != nil {
			return nil, err
		}
		s1, err := G.Sum(pp)
		if err != nil {
			return nil, err
		}
		tk, err := G.HadamardProd(th, k)
		if err != nil {
			return nil, err
		}
		s2, err := G.Sum(tk)
		if err != nil {
			return nil, err
		}
		return G.Add(s1, s2)
	}
	ref, _ := newStage(cfg)
	_, want := referenceGrads(t, func(b *models.Builder) (*G.Node, error) {
		h, err := ref.Forward(b, b.Bind("x", x))
		if err != nil {
			return nil, err
		}
		k := b.Bind("b", bconst)
		p, err := G.HadamardProd(h, k)
		if err != nil {
			return nil, err
		}
		th, err := G.Tanh(h)
		if err != nil {
			return nil, err
		}
		return lossOf(b, p, th, k)
	})
	stage, err := NewRemoteModule(ctx, agents[0], "w1", "stage.new", cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer stage.Close(ctx)
	loss := NewFunction("loss", func(b *models.Builder, in []*G.Node) ([]*G.Node, error) {
		l, err := lossOf(b, in[0], in[1], in[2])
		return []*G.Node{l}, err
	})
	err = WithContext(ctx, agents[0], func(ctx context.Context, c *Context) error {
		h, err := stage.Forward(ctx, c, x)
		if err != nil {
			return err
		}
		out, err := rpc.Sync[pairOut](ctx, agents[0], "w2", "pair", pairArg{A: h, B: bconst, Scale: 2})
		if err != nil {
			return err
		}
		if c.Tracked(out.Named["const"]) || !c.Tracked(out.Prod) || !c.Tracked(out.Named["tanh"]) {
			t.Errorf("tracked: prod %v tanh %v const %v; want true true false", c.Tracked(out.Prod), c.Tracked(out.Named["tanh"]), c.Tracked(out.Named["const"]))
		}
		l, err := loss.Apply(ctx, c, out.Prod, out.Named["tanh"], out.Named["const"])
		if err != nil {
			return err
		}
		if err := c.Backward(ctx, l[0]); err != nil {
			return err
		}
		got, err := GetGradients(agents[1], c.ID())
		if err != nil {
			return err
		}
		if len(got) != 2 {
			t.Errorf("%d gradients on worker 1", len(got))
		}
		for p, g := range got {
			for rp, w := range want {
				if rp.Name == p.Name {
					if d := maxAbsDiff(t, g, w); d > 1e-12 {
						t.Errorf("gradient of %s differs by %g", p.Name, d)
					}
				}
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	noContexts(t, agents)
}
