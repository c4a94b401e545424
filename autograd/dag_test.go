package autograd

import (
	"context"
	"math/rand/v2"
	"testing"
	"time"

	G "gorgonia.org/gorgonia"
	"gorgonia.org/tensor"

	"github.com/tandemml/tandem/models"
)

// dagLoss is the driver's part of the DAG: it reads h (the output of
// worker 1) directly as well as y1 and y2 (worker 2's two results on h).
func dagLoss(b *models.Builder, h, y1, y2, target *G.Node) (*G.Node, error) {
	l1, err := models.MSE(y1, target)
	if err != nil {
		return nil, err
	}
	p, err := G.HadamardProd(y1, y2)
	if err != nil {
		return nil, err
	}
	l2, err := G.Sum(p)
	if err != nil {
		return nil, err
	}
	h2, err := G.Square(h)
	if err != nil {
		return nil, err
	}
	l3, err := G.Mean(h2)
	if err != nil {
		return nil, err
	}
	s, err := G.Add(l1, l2)
	if err != nil {
		return nil, err
	}
	return G.Add(s, l3)
}

// The output of worker 1 is used three times: sent twice to worker 2 and
// read locally. Gradients of both workers' parameters and of the input
// match one graph of the whole computation and finite differences.
func TestDAGGradients(t *testing.T) {
	agents := startGroup(t, 3, registerStage)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cfgA := stageConfig{In: 3, Out: 4, Tanh: true, Seed: 21}
	cfgB := stageConfig{In: 4, Out: 2, Tanh: true, Seed: 22}
	rng := rand.New(rand.NewPCG(7, 8))
	x, target := randDense(rng, 2, 3), randDense(rng, 2, 2)

	refA, _ := newStage(cfgA)
	refB, _ := newStage(cfgB)
	build := func(b *models.Builder, xn *G.Node) (*G.Node, error) {
		h, err := refA.Forward(b, xn)
		if err != nil {
			return nil, err
		}
		y1, err := refB.Forward(b, h)
		if err != nil {
			return nil, err
		}
		y2, err := refB.Forward(b, h)
		if err != nil {
			return nil, err
		}
		return dagLoss(b, h, y1, y2, b.Bind("t", target))
	}
	_, refGrads := referenceGrads(t, func(b *models.Builder) (*G.Node, error) { return build(b, b.Bind("x", x)) })
	lossAt := func(xv *tensor.Dense) float64 {
		b := models.NewBuilder(nil)
		l, err := build(b, b.Bind("x", xv))
		if err != nil {
			t.Fatal(err)
		}
		vm := G.NewTapeMachine(b.Graph())
		defer vm.Close()
		if err := vm.RunAll(); err != nil {
			t.Fatal(err)
		}
		v, _ := valueDense(l.Value(), tensor.Shape{})
		return v.Float64s()[0]
	}

	stageA, err := NewRemoteModule(ctx, agents[0], "w1", "stage.new", cfgA)
	if err != nil {
		t.Fatal(err)
	}
	defer stageA.Close(ctx)
	stageB, err := NewRemoteModule(ctx, agents[0], "w2", "stage.new", cfgB)
	if err != nil {
		t.Fatal(err)
	}
	defer stageB.Close(ctx)
	loss := NewFunction("dag-loss", func(b *models.Builder, in []*G.Node) ([]*G.Node, error) {
		l, err := dagLoss(b, in[0], in[1], in[2], in[3])
		return []*G.Node{l}, err
	})
	err = WithContext(ctx, agents[0], func(ctx context.Context, c *Context) error {
		if err := c.RequireGrad(x); err != nil {
			return err
		}
		h, err := stageA.Forward(ctx, c, x)
		if err != nil {
			return err
		}
		// two calls in flight at once, both carrying h
		f1 := stageB.ForwardAsync(ctx, c, h)
		f2 := stageB.ForwardAsync(ctx, c, h)
		y1, err := f1.Wait(ctx)
		if err != nil {
			return err
		}
		y2, err := f2.Wait(ctx)
		if err != nil {
			return err
		}
		l, err := loss.Apply(ctx, c, h, y1, y2, target)
		if err != nil {
			return err
		}
		if err := c.Backward(ctx, l[0]); err != nil {
			return err
		}
		// Worker 1's parameters against the one-graph gradients of refA,
		// worker 2's against refB's.
		for w, ref := range map[int]models.Module{1: refA, 2: refB} {
			got, err := GetGradients(agents[w], c.ID())
			if err != nil {
				return err
			}
			if len(got) != 2 {
				t.Errorf("worker %d has %d gradients, want 2", w, len(got))
			}
			for p, g := range got {
				var want *tensor.Dense
				for _, rp := range ref.Params() {
					if rp.Name == p.Name {
						want = refGrads[rp]
					}
				}
				if want == nil {
					t.Errorf("worker %d: unexpected gradient for %s", w, p.Name)
					continue
				}
				if d := maxAbsDiff(t, g, want); d > 1e-12 {
					t.Errorf("worker %d: gradient of %s differs from one graph by %g", w, p.Name, d)
				}
			}
		}
		// The input's gradient against central finite differences.
		gx := c.Grad(x)
		if gx == nil {
			t.Fatal("no gradient for x")
		}
		const eps = 1e-6
		for i := range x.Float64s() {
			xp, xm := x.Clone().(*tensor.Dense), x.Clone().(*tensor.Dense)
			xp.Float64s()[i] += eps
			xm.Float64s()[i] -= eps
			fd := (lossAt(xp) - lossAt(xm)) / (2 * eps)
			if d := fd - gx.Float64s()[i]; d > 1e-6 || d < -1e-6 {
				t.Errorf("d loss/d x[%d] = %v, finite differences %v", i, gx.Float64s()[i], fd)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	noContexts(t, agents)
}
