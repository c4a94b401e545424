package graph_test

import (
	"context"
	"fmt"

	G "gorgonia.org/gorgonia"
	"gorgonia.org/tensor"

	"github.com/tandemml/tandem/graph"
)

// A linear model's cost and gradient, run twice with new data; a hook sees the
// gradient of w as soon as it is computed.
func Example() {
	g := G.NewGraph()
	x := G.NewMatrix(g, tensor.Float64, G.WithShape(2, 3), G.WithName("x"))
	w := G.NewMatrix(g, tensor.Float64, G.WithShape(3, 1), G.WithName("w"),
		G.WithValue(tensor.New(tensor.WithShape(3, 1), tensor.WithBacking([]float64{1, 2, 3}))))
	cost := G.Must(G.Sum(G.Must(G.Mul(x, w))))
	grads, err := G.Grad(cost, w)
	if err != nil {
		panic(err)
	}

	prog, err := graph.Compile(g, graph.WithGrads(G.Nodes{w}, grads))
	if err != nil {
		panic(err)
	}
	err = prog.OnGradReady(w, func(_ context.Context, wrt *G.Node, grad G.Value) error {
		fmt.Printf("gradient of %s ready: %v\n", wrt.Name(), grad.Data())
		return nil
	})
	if err != nil {
		panic(err)
	}

	ctx := context.Background()
	for _, batch := range [][]float64{{1, 1, 1, 1, 1, 1}, {1, 0, 0, 0, 1, 0}} {
		xv := tensor.New(tensor.WithShape(2, 3), tensor.WithBacking(batch))
		if err := prog.Run(ctx, graph.Bind(x, xv)); err != nil {
			panic(err)
		}
		fmt.Println("cost:", cost.Value())
	}
	// Output:
	// gradient of w ready: [2 2 2]
	// cost: 12
	// gradient of w ready: [1 1 0]
	// cost: 3
}
