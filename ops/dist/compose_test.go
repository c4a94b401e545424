package dist

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
	"time"

	G "gorgonia.org/gorgonia"
	"gorgonia.org/tensor"

	"github.com/tandemml/tandem/comm"
	"github.com/tandemml/tandem/graph"
)

// The composition test trains a two-layer MLP, z = tanh(x W1 + b1) W2 + b2
// with a mean squared error, split over the ranks of a tensor-parallel
// group, and checks that every step leaves the same weights as the same MLP
// trained in one process.
//
// W1 and b1 are split by columns (column-parallel): rank r computes its
// slice h_r of the hidden layer from the whole input. Then either
//
//   - sharded: W2 is split by rows (row-parallel); rank r computes its partial
//     product p_r = h_r W2_r and AllReduce(sum) adds the partials. Its
//     backward, an all-reduce of the gradients, hands every rank the whole
//     gradient of z (each rank holds 1/world of the objective, see below);
//   - gathered: AllGather collects every rank's slice of h, which goes into
//     a replicated W2. Its backward is a reduce-scatter: each rank gets the
//     gradient of its own slice, summed over the ranks' replicas of the layer.
//
// The objective of the job is the sum of the ranks' losses, and every rank
// computes the same loss from the same all-reduced z: each rank therefore
// contributes loss/world. Replicated parameters (b2, and W2 when gathered)
// get 1/world of their gradient on each rank, so their gradients are
// all-reduced (sum) in the graph, after the backward pass, as data-parallel
// training would.

type mlpShape struct {
	batch, in, hidden, out int
	steps                  int
	lr                     float64
}

// mlpParams are the full weights (layouts as the matrices multiply: W1 is
// [in, hidden], W2 [hidden, out]).
type mlpParams struct {
	W1, B1, W2, B2 *tensor.Dense
}

func (p mlpParams) clone() mlpParams {
	return mlpParams{
		W1: p.W1.Clone().(*tensor.Dense), B1: p.B1.Clone().(*tensor.Dense),
		W2: p.W2.Clone().(*tensor.Dense), B2: p.B2.Clone().(*tensor.Dense),
	}
}

func TestTensorParallelMLP(t *testing.T) {
	s := mlpShape{batch: 5, in: 3, hidden: 6, out: 2, steps: 6, lr: 0.2}
	const world = 2
	rng := rand.New(rand.NewPCG(3, 5))
	init := mlpParams{
		W1: randTensor(rng, tensor.Shape{s.in, s.hidden}), B1: randTensor(rng, tensor.Shape{s.hidden}),
		W2: randTensor(rng, tensor.Shape{s.hidden, s.out}), B2: randTensor(rng, tensor.Shape{s.out}),
	}
	xs := make([]*tensor.Dense, s.steps)
	ys := make([]*tensor.Dense, s.steps)
	for i := range xs {
		xs[i] = randTensor(rng, tensor.Shape{s.batch, s.in})
		ys[i] = randTensor(rng, tensor.Shape{s.batch, s.out})
	}

	want, wantLoss, err := trainSingle(s, init.clone(), xs, ys)
	if err != nil {
		t.Fatal(err)
	}
	for _, gathered := range []bool{false, true} {
		name := "sharded"
		if gathered {
			name = "gathered"
		}
		t.Run(name, func(t *testing.T) {
			ctx := ctxFor(t, time.Minute)
			pgs := localGroups(t, ctx, world)
			ranks := make([]*tpRank, world)
			for r, pg := range pgs {
				var err error
				if ranks[r], err = newTPRank(pg, s, shard(init, r, world, gathered), gathered); err != nil {
					t.Fatalf("rank %d: %v", r, err)
				}
			}
			losses := make([][]float64, world)
			mustRanks(t, pgs, func(r int, _ *comm.ProcessGroup) error {
				var err error
				losses[r], err = ranks[r].train(ctx, xs, ys)
				return err
			})
			for r := range ranks {
				for i := range wantLoss {
					if d := math.Abs(losses[r][i] - wantLoss[i]); d > 1e-10 {
						t.Errorf("rank %d step %d: loss %v, single process %v", r, i, losses[r][i], wantLoss[i])
					}
				}
			}
			got := unshard(ranks, gathered)
			for _, p := range []struct {
				name      string
				got, want *tensor.Dense
			}{{"W1", got.W1, want.W1}, {"b1", got.B1, want.B1}, {"W2", got.W2, want.W2}, {"b2", got.B2, want.B2}} {
				if err := closeTo(p.got.Float64s(), p.want.Float64s(), 1e-10); err != nil {
					t.Errorf("%s after %d steps: %v", p.name, s.steps, err)
				}
			}
			// The training moved the weights: the comparison is not vacuous.
			if err := closeTo(want.W1.Float64s(), init.W1.Float64s(), 1e-3); err == nil {
				t.Error("W1 did not move during training")
			}
		})
	}
}

// mlpLoss builds mean((z - y)^2) * scale for z = tanh(x W1 + b1) W2 + b2,
// with h computed by hidden and the second layer by second.
func mse(z, y *G.Node, scale float64) (*G.Node, error) {
	d, err := G.Sub(z, y)
	if err != nil {
		return nil, err
	}
	sq, err := G.Square(d)
	if err != nil {
		return nil, err
	}
	m, err := G.Mean(sq)
	if err != nil {
		return nil, err
	}
	if scale == 1 {
		return m, nil
	}
	return G.Mul(m, G.NewConstant(scale, G.WithName(fmt.Sprintf("scale%v", scale))))
}

// linear is x W + b, b broadcast over the batch.
func linear(x, w, b *G.Node) (*G.Node, error) {
	xw, err := G.Mul(x, w)
	if err != nil {
		return nil, err
	}
	return G.BroadcastAdd(xw, b, nil, []byte{0})
}

func param(g *G.ExprGraph, name string, v *tensor.Dense) *G.Node {
	return input(g, name, v)
}

// trainSingle trains the MLP in one process and returns the final weights
// and the loss of each step.
func trainSingle(s mlpShape, p mlpParams, xs, ys []*tensor.Dense) (mlpParams, []float64, error) {
	g := G.NewGraph()
	x := G.NewMatrix(g, tensor.Float64, G.WithShape(s.batch, s.in), G.WithName("x"))
	y := G.NewMatrix(g, tensor.Float64, G.WithShape(s.batch, s.out), G.WithName("y"))
	w1, b1 := param(g, "W1", p.W1), param(g, "b1", p.B1)
	w2, b2 := param(g, "W2", p.W2), param(g, "b2", p.B2)
	pre, err := linear(x, w1, b1)
	if err != nil {
		return p, nil, err
	}
	h, err := G.Tanh(pre)
	if err != nil {
		return p, nil, err
	}
	z, err := linear(h, w2, b2)
	if err != nil {
		return p, nil, err
	}
	loss, err := mse(z, y, 1)
	if err != nil {
		return p, nil, err
	}
	params := G.Nodes{w1, b1, w2, b2}
	grads, err := G.Grad(loss, params...)
	if err != nil {
		return p, nil, err
	}
	prog, err := graph.Compile(g, graph.WithGrads(params, grads))
	if err != nil {
		return p, nil, err
	}
	vals := []*tensor.Dense{p.W1, p.B1, p.W2, p.B2}
	var losses []float64
	for i := range xs {
		bs := []graph.Binding{graph.Bind(x, xs[i]), graph.Bind(y, ys[i])}
		for k, n := range params {
			bs = append(bs, graph.Bind(n, vals[k]))
		}
		if err := prog.Run(context.Background(), bs...); err != nil {
			return p, nil, err
		}
		l, _ := flatFloats(prog.Value(loss))
		losses = append(losses, l[0])
		for k, n := range params {
			gv, err := prog.Grad(n)
			if err != nil {
				return p, nil, err
			}
			if err := sgd(vals[k], gv, s.lr); err != nil {
				return p, nil, err
			}
		}
	}
	return p, losses, nil
}

// sgd computes p -= lr * g in place.
func sgd(p *tensor.Dense, g G.Value, lr float64) error {
	gs, err := flatFloats(g)
	if err != nil {
		return err
	}
	ps := p.Float64s()
	if len(ps) != len(gs) {
		return fmt.Errorf("parameter of %d elements, gradient of %d", len(ps), len(gs))
	}
	for i := range ps {
		ps[i] -= lr * gs[i]
	}
	return nil
}

// shard returns rank r's parameters: columns of W1 and b1; rows of W2 when
// the hidden layer stays sharded, all of W2 when it is gathered; all of b2.
func shard(p mlpParams, r, world int, gathered bool) mlpParams {
	h := p.W1.Shape()[1] / world
	lo, hi := r*h, (r+1)*h
	out := mlpParams{
		W1: mustDense(p.W1.Slice(nil, G.S(lo, hi))),
		B1: mustDense(p.B1.Slice(G.S(lo, hi))),
		W2: p.W2.Clone().(*tensor.Dense),
		B2: p.B2.Clone().(*tensor.Dense),
	}
	if !gathered {
		out.W2 = mustDense(p.W2.Slice(G.S(lo, hi)))
	}
	return out
}

func mustDense(v tensor.View, err error) *tensor.Dense {
	if err != nil {
		panic(err)
	}
	return v.(*tensor.Dense).Materialize().(*tensor.Dense)
}

// unshard reassembles the full weights from the ranks' shards (the
// replicated ones from rank 0, after checking the replicas agree).
func unshard(ranks []*tpRank, gathered bool) mlpParams {
	w1s := make([]*tensor.Dense, len(ranks))
	b1s := make([]*tensor.Dense, len(ranks))
	w2s := make([]*tensor.Dense, len(ranks))
	for r, k := range ranks {
		w1s[r], b1s[r], w2s[r] = k.vals[0], k.vals[1], k.vals[2]
	}
	p := mlpParams{W1: mustConcat(1, w1s), B1: mustConcat(0, b1s), B2: ranks[0].vals[3]}
	if gathered {
		p.W2 = ranks[0].vals[2]
	} else {
		p.W2 = mustConcat(0, w2s)
	}
	return p
}

func mustConcat(axis int, ts []*tensor.Dense) *tensor.Dense {
	c, err := ts[0].Concat(axis, ts[1:]...)
	if err != nil {
		panic(err)
	}
	return c
}

// tpRank is one rank's tensor-parallel MLP.
type tpRank struct {
	pg       *comm.ProcessGroup
	s        mlpShape
	prog     *graph.Program
	x, y     *G.Node
	loss     *G.Node
	params   G.Nodes
	vals     []*tensor.Dense
	gradOuts G.Nodes // the gradient each parameter is updated with
}

func newTPRank(pg *comm.ProcessGroup, s mlpShape, p mlpParams, gathered bool) (*tpRank, error) {
	w := pg.Size()
	g := G.NewGraph()
	k := &tpRank{pg: pg, s: s, vals: []*tensor.Dense{p.W1, p.B1, p.W2, p.B2}}
	k.x = G.NewMatrix(g, tensor.Float64, G.WithShape(s.batch, s.in), G.WithName("x"))
	k.y = G.NewMatrix(g, tensor.Float64, G.WithShape(s.batch, s.out), G.WithName("y"))
	w1, b1 := param(g, "W1", p.W1), param(g, "b1", p.B1)
	w2, b2 := param(g, "W2", p.W2), param(g, "b2", p.B2)
	k.params = G.Nodes{w1, b1, w2, b2}

	// Column-parallel first layer: this rank's slice of the hidden units.
	pre, err := linear(k.x, w1, b1)
	if err != nil {
		return nil, err
	}
	h, err := G.Tanh(pre)
	if err != nil {
		return nil, err
	}
	var z *G.Node
	if gathered {
		parts, err := AllGather(pg, h)
		if err != nil {
			return nil, err
		}
		full, err := G.Concat(1, parts...)
		if err != nil {
			return nil, err
		}
		if z, err = linear(full, w2, b2); err != nil {
			return nil, err
		}
	} else {
		// Row-parallel second layer: partial products, summed across ranks.
		partial, err := G.Mul(h, w2)
		if err != nil {
			return nil, err
		}
		sum, err := AllReduce(pg, partial, comm.Sum)
		if err != nil {
			return nil, err
		}
		if z, err = G.BroadcastAdd(sum, b2, nil, []byte{0}); err != nil {
			return nil, err
		}
	}
	// Every rank computes the same loss; each contributes 1/world of it.
	if k.loss, err = mse(z, k.y, 1/float64(w)); err != nil {
		return nil, err
	}
	grads, err := G.Grad(k.loss, k.params...)
	if err != nil {
		return nil, err
	}
	// Replicated parameters: add up the ranks' shares of their gradient.
	k.gradOuts = append(G.Nodes(nil), grads...)
	replicated := []int{3}
	if gathered {
		replicated = []int{2, 3}
	}
	for _, i := range replicated {
		if k.gradOuts[i], err = AllReduce(pg, grads[i], comm.Sum); err != nil {
			return nil, err
		}
	}
	k.prog, err = graph.Compile(g, graph.WithGrads(k.params, grads), graph.Workers(2))
	return k, err
}

// train runs the steps and returns the loss of each (the whole loss: world
// times this rank's share).
func (k *tpRank) train(ctx context.Context, xs, ys []*tensor.Dense) ([]float64, error) {
	var losses []float64
	for i := range xs {
		bs := []graph.Binding{graph.Bind(k.x, xs[i]), graph.Bind(k.y, ys[i])}
		for j, n := range k.params {
			bs = append(bs, graph.Bind(n, k.vals[j]))
		}
		if err := k.prog.Run(ctx, bs...); err != nil {
			return nil, err
		}
		l, err := flatFloats(k.prog.Value(k.loss))
		if err != nil {
			return nil, err
		}
		losses = append(losses, l[0]*float64(k.pg.Size()))
		for j, gn := range k.gradOuts {
			if err := sgd(k.vals[j], k.prog.Value(gn), k.s.lr); err != nil {
				return nil, fmt.Errorf("step %d, %s: %w", i, k.params[j].Name(), err)
			}
		}
	}
	return losses, nil
}
