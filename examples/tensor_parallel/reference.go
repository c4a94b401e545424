package main

import (
	"context"

	G "gorgonia.org/gorgonia"
	"gorgonia.org/tensor"

	"github.com/tandemml/tandem/graph"
)

// trainSingle trains the whole MLP in one process, as the reference the
// tensor-parallel run must reproduce: it returns the final weights and the
// loss of every step.
func trainSingle(ctx context.Context, cfg config) (weights, []float64, error) {
	w := initWeights(cfg)
	g := G.NewGraph()
	x := G.NewMatrix(g, tensor.Float64, G.WithShape(cfg.batch, cfg.in), G.WithName("x"))
	y := G.NewMatrix(g, tensor.Float64, G.WithShape(cfg.batch, cfg.out), G.WithName("y"))
	vals := []*tensor.Dense{w.W1, w.B1, w.W2, w.B2}
	params := make(G.Nodes, len(vals))
	for i, name := range []string{"W1", "b1", "W2", "b2"} {
		v := vals[i]
		params[i] = G.NewTensor(g, tensor.Float64, v.Dims(), G.WithShape(v.Shape().Clone()...), G.WithName(name), G.WithValue(v))
	}
	pre := G.Must(G.BroadcastAdd(G.Must(G.Mul(x, params[0])), params[1], nil, []byte{0}))
	z := G.Must(G.BroadcastAdd(G.Must(G.Mul(G.Must(G.Tanh(pre)), params[2])), params[3], nil, []byte{0}))
	loss := G.Must(G.Mean(G.Must(G.Square(G.Must(G.Sub(z, y))))))
	grads, err := G.Grad(loss, params...)
	if err != nil {
		return w, nil, err
	}
	prog, err := graph.Compile(g, graph.WithGrads(params, grads))
	if err != nil {
		return w, nil, err
	}
	losses := make([]float64, cfg.steps)
	for s := range losses {
		xb, yb := batchAt(cfg, s)
		bs := []graph.Binding{graph.Bind(x, xb), graph.Bind(y, yb)}
		for i, n := range params {
			bs = append(bs, graph.Bind(n, vals[i]))
		}
		if err := prog.Run(ctx, bs...); err != nil {
			return w, nil, err
		}
		losses[s] = scalar(prog.Value(loss))
		for i, gn := range grads {
			if err := sgd(vals[i], prog.Value(gn), cfg.lr); err != nil {
				return w, nil, err
			}
		}
	}
	return w, losses, nil
}
