package main

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"

	G "gorgonia.org/gorgonia"
	"gorgonia.org/tensor"

	"github.com/tandemml/tandem/comm"
	"github.com/tandemml/tandem/graph"
	"github.com/tandemml/tandem/ops/dist"
)

// config sizes the MLP z = tanh(x W1 + b1) W2 + b2 and its training.
type config struct {
	in, hidden, out int
	batch, steps    int
	lr              float64
	seed            uint64
}

// weights are a full model or one rank's shard. Layouts are as the
// matrices multiply: W1 is [in, hidden], W2 is [hidden, out].
type weights struct {
	W1, B1, W2, B2 *tensor.Dense
}

// initWeights draws the full model from cfg.seed, so every rank (and the
// single-process reference) starts from the same weights.
func initWeights(cfg config) weights {
	rng := rand.New(rand.NewPCG(cfg.seed, 1))
	normal := func(scale float64, shape ...int) *tensor.Dense {
		n := 1
		for _, s := range shape {
			n *= s
		}
		b := make([]float64, n)
		for i := range b {
			b[i] = rng.NormFloat64() * scale
		}
		return tensor.New(tensor.WithShape(shape...), tensor.WithBacking(b))
	}
	return weights{
		W1: normal(1/math.Sqrt(float64(cfg.in)), cfg.in, cfg.hidden),
		B1: normal(0.1, cfg.hidden),
		W2: normal(1/math.Sqrt(float64(cfg.hidden)), cfg.hidden, cfg.out),
		B2: normal(0.1, cfg.out),
	}
}

// batchAt returns step's batch: inputs in [-1, 1] and targets from a fixed
// smooth function of them. Every rank of a tensor-parallel group sees the
// same batch.
func batchAt(cfg config, step int) (x, y *tensor.Dense) {
	rng := rand.New(rand.NewPCG(cfg.seed, uint64(1000+step)))
	xs := make([]float64, cfg.batch*cfg.in)
	for i := range xs {
		xs[i] = 2*rng.Float64() - 1
	}
	ys := make([]float64, cfg.batch*cfg.out)
	for b := 0; b < cfg.batch; b++ {
		for o := 0; o < cfg.out; o++ {
			s := 0.0
			for i := 0; i < cfg.in; i++ {
				s += xs[b*cfg.in+i] * float64((i+o)%3-1)
			}
			ys[b*cfg.out+o] = math.Sin(s) + 0.5*float64(o)
		}
	}
	return tensor.New(tensor.WithShape(cfg.batch, cfg.in), tensor.WithBacking(xs)),
		tensor.New(tensor.WithShape(cfg.batch, cfg.out), tensor.WithBacking(ys))
}

// shard returns rank r's part of the full weights: columns r of W1 and b1
// (the hidden units it computes), the matching rows of W2, and all of b2.
func (w weights) shard(r, world int) (weights, error) {
	h := w.W1.Shape()[1]
	if h%world != 0 {
		return weights{}, fmt.Errorf("hidden size %d does not split over %d ranks", h, world)
	}
	lo, hi := r*h/world, (r+1)*h/world
	cols, err := w.W1.Slice(nil, G.S(lo, hi))
	if err != nil {
		return weights{}, err
	}
	b1, err := w.B1.Slice(G.S(lo, hi))
	if err != nil {
		return weights{}, err
	}
	rows, err := w.W2.Slice(G.S(lo, hi))
	if err != nil {
		return weights{}, err
	}
	return weights{
		W1: cols.(*tensor.Dense).Materialize().(*tensor.Dense),
		B1: b1.(*tensor.Dense).Materialize().(*tensor.Dense),
		W2: rows.(*tensor.Dense).Materialize().(*tensor.Dense),
		B2: w.B2.Clone().(*tensor.Dense),
	}, nil
}

// tpRank is one rank's tensor-parallel MLP: a gorgonia graph holding its
// shard, compiled with its backward pass.
type tpRank struct {
	pg     *comm.ProcessGroup
	cfg    config
	w      weights
	prog   *graph.Program
	x, y   *G.Node
	loss   *G.Node
	params G.Nodes
	update G.Nodes // the gradient each parameter is updated with
}

// newTPRank builds rank pg.Rank()'s graph:
//
//	h_r = tanh(x W1_r + b1_r)          column-parallel: this rank's hidden units
//	p_r = h_r W2_r                     row-parallel: this rank's partial output
//	z   = AllReduce(p, sum) + b2       every rank gets the whole output
//	loss_r = mean((z - y)^2) / world   the job's objective is sum_r loss_r
//
// and differentiates it. The forward pass has one collective (the
// all-reduce); gorgonia.Grad adds its backward, an all-reduce of the
// gradients of z, and the update of the replicated b2 needs one more: the
// all-reduce of its gradient.
func newTPRank(pg *comm.ProcessGroup, cfg config, w weights) (*tpRank, error) {
	world := pg.Size()
	g := G.NewGraph()
	k := &tpRank{pg: pg, cfg: cfg, w: w}
	k.x = G.NewMatrix(g, tensor.Float64, G.WithShape(cfg.batch, cfg.in), G.WithName("x"))
	k.y = G.NewMatrix(g, tensor.Float64, G.WithShape(cfg.batch, cfg.out), G.WithName("y"))
	param := func(name string, v *tensor.Dense) *G.Node {
		return G.NewTensor(g, tensor.Float64, v.Dims(), G.WithShape(v.Shape().Clone()...), G.WithName(name), G.WithValue(v))
	}
	w1, b1, w2, b2 := param("W1", w.W1), param("b1", w.B1), param("W2", w.W2), param("b2", w.B2)
	k.params = G.Nodes{w1, b1, w2, b2}

	// Column-parallel Linear: x is replicated, W1 split by columns.
	xw, err := G.Mul(k.x, w1)
	if err != nil {
		return nil, err
	}
	pre, err := G.BroadcastAdd(xw, b1, nil, []byte{0})
	if err != nil {
		return nil, err
	}
	h, err := G.Tanh(pre)
	if err != nil {
		return nil, err
	}
	// Row-parallel Linear: the hidden units stay sharded, W2 split by rows,
	// and the partial products are summed across the ranks.
	partial, err := G.Mul(h, w2)
	if err != nil {
		return nil, err
	}
	sum, err := dist.AllReduce(pg, partial, comm.Sum)
	if err != nil {
		return nil, err
	}
	z, err := G.BroadcastAdd(sum, b2, nil, []byte{0})
	if err != nil {
		return nil, err
	}
	diff, err := G.Sub(z, k.y)
	if err != nil {
		return nil, err
	}
	mse, err := G.Mean(G.Must(G.Square(diff)))
	if err != nil {
		return nil, err
	}
	share := G.NewConstant(1/float64(world), G.WithName("one_over_world"))
	if k.loss, err = G.Mul(mse, share); err != nil {
		return nil, err
	}

	grads, err := G.Grad(k.loss, k.params...)
	if err != nil {
		return nil, err
	}
	k.update = append(G.Nodes(nil), grads...)
	// b2 is replicated: each rank holds 1/world of its gradient.
	if k.update[3], err = dist.AllReduce(pg, grads[3], comm.Sum); err != nil {
		return nil, err
	}
	k.prog, err = graph.Compile(g, graph.WithGrads(k.params, grads))
	return k, err
}

// step runs one training step on a batch and returns the loss (the whole
// model's: world times this rank's share).
func (k *tpRank) step(ctx context.Context, x, y *tensor.Dense) (float64, error) {
	vals := []*tensor.Dense{k.w.W1, k.w.B1, k.w.W2, k.w.B2}
	bs := []graph.Binding{graph.Bind(k.x, x), graph.Bind(k.y, y)}
	for i, n := range k.params {
		bs = append(bs, graph.Bind(n, vals[i]))
	}
	if err := k.prog.Run(ctx, bs...); err != nil {
		return 0, err
	}
	for i, u := range k.update {
		if err := sgd(vals[i], k.prog.Value(u), k.cfg.lr); err != nil {
			return 0, fmt.Errorf("updating %s: %w", k.params[i].Name(), err)
		}
	}
	return scalar(k.prog.Value(k.loss)) * float64(k.pg.Size()), nil
}

// sgd computes p -= lr * g in place.
func sgd(p *tensor.Dense, g G.Value, lr float64) error {
	gt, ok := g.(*tensor.Dense)
	if !ok {
		return fmt.Errorf("gradient is a %T", g)
	}
	ps, gs := p.Float64s(), gt.Float64s()
	if len(ps) != len(gs) {
		return fmt.Errorf("%d parameters, %d gradients", len(ps), len(gs))
	}
	for i := range ps {
		ps[i] -= lr * gs[i]
	}
	return nil
}

// scalar reads a float64 scalar value.
func scalar(v G.Value) float64 {
	switch s := v.(type) {
	case *G.F64:
		return float64(*s)
	case *tensor.Dense:
		return s.Float64s()[0]
	}
	return math.NaN()
}

// maxDiff is the largest absolute difference between two weight sets.
func maxDiff(a, b weights) float64 {
	d := 0.0
	for _, p := range [][2]*tensor.Dense{{a.W1, b.W1}, {a.B1, b.B1}, {a.W2, b.W2}, {a.B2, b.B2}} {
		x, y := p[0].Float64s(), p[1].Float64s()
		if len(x) != len(y) {
			return math.Inf(1)
		}
		for i := range x {
			d = math.Max(d, math.Abs(x[i]-y[i]))
		}
	}
	return d
}
