package ddp_test

import (
	"context"
	"fmt"

	G "gorgonia.org/gorgonia"
	"gorgonia.org/tensor"

	"github.com/tandemml/tandem/comm"
	"github.com/tandemml/tandem/ddp"
)

// A plain gorgonia program, data-parallel: each rank builds the same graph
// and its gradient nodes, NewGraph makes them agree, and gorgonia's own
// solver applies the averaged gradients.
func ExampleNewGraph() {
	fmt.Println("replicas identical:", replicasAgree(2, trainGraph))
	// Output:
	// rank 0: loss 2.5000 then 0.6250
	// replicas identical: true
}

// trainGraph is what every rank runs: fit y = 2x with one weight.
func trainGraph(ctx context.Context, pg *comm.ProcessGroup) []float64 {
	g := G.NewGraph()
	x := G.NewMatrix(g, G.Float64, G.WithShape(2, 1), G.WithName("x"))
	y := G.NewMatrix(g, G.Float64, G.WithShape(2, 1), G.WithName("y"))
	// Each rank starts elsewhere; NewGraph copies rank 0's value (1).
	w := G.NewMatrix(g, G.Float64, G.WithShape(1, 1), G.WithName("w"),
		G.WithValue(tensor.New(tensor.WithShape(1, 1), tensor.WithBacking([]float64{float64(1 + pg.Rank())}))))
	loss := G.Must(G.Mean(G.Must(G.Square(G.Must(G.Sub(G.Must(G.Mul(x, w)), y))))))
	grads, err := G.Grad(loss, w)
	if err != nil {
		panic(err)
	}
	net, err := ddp.NewGraph(ctx, pg, ddp.GraphSpec{Graph: g, Loss: loss, Params: G.Nodes{w}, Grads: grads})
	if err != nil {
		panic(err)
	}
	solver := G.NewVanillaSolver(G.WithLearnRate(0.1))
	// Rank r's share of the data: x = 2r+1, 2r+2.
	r := float64(pg.Rank())
	xb := tensor.New(tensor.WithShape(2, 1), tensor.WithBacking([]float64{2*r + 1, 2*r + 2}))
	yb := tensor.New(tensor.WithShape(2, 1), tensor.WithBacking([]float64{2 * (2*r + 1), 2 * (2*r + 2)}))
	var losses []float64
	for range 2 {
		l, err := net.Step(ctx, ddp.ByName{"x": xb, "y": yb})
		if err != nil {
			panic(err)
		}
		losses = append(losses, l)
		if err := net.Apply(solver); err != nil {
			panic(err)
		}
	}
	if pg.Rank() == 0 {
		fmt.Printf("rank 0: loss %.4f then %.4f\n", losses[0], losses[1])
	}
	return w.Value().Data().([]float64)
}
