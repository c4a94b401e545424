package dist_test

import (
	"context"
	"fmt"
	"sync"
	"time"

	G "gorgonia.org/gorgonia"
	"gorgonia.org/tensor"

	"github.com/tandemml/tandem/comm"
	"github.com/tandemml/tandem/comm/local"
	"github.com/tandemml/tandem/graph"
	"github.com/tandemml/tandem/ops/dist"
)

// Two ranks (goroutines here, processes in a real job) take the elementwise
// maximum of their vectors and differentiate the sum of every rank's loss.
// The gradient goes to the rank holding the maximum; the tie in the second
// element is shared equally.
func Example() {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	pgs, err := local.NewGroups(ctx, 2)
	if err != nil {
		panic(err)
	}

	// Each rank builds its graph: x, y = AllReduce(x, max), loss = sum(y).
	// (In one process, build the ranks' graphs one after the other: gorgonia
	// shares a few constant nodes between graphs while building them.)
	type rank struct {
		prog *graph.Program
		x, y *G.Node
	}
	ranks := make([]rank, len(pgs))
	for r, pg := range pgs {
		g := G.NewGraph()
		xv := [][]float64{{1, 5}, {3, 5}}[r]
		x := G.NewVector(g, tensor.Float64, G.WithShape(2), G.WithName("x"),
			G.WithValue(tensor.New(tensor.WithShape(2), tensor.WithBacking(xv))))
		y, err := dist.AllReduce(pg, x, comm.Max)
		if err != nil {
			panic(err)
		}
		grads, err := G.Grad(G.Must(G.Sum(y)), x)
		if err != nil {
			panic(err)
		}
		prog, err := graph.Compile(g, graph.WithGrads(G.Nodes{x}, grads))
		if err != nil {
			panic(err)
		}
		ranks[r] = rank{prog, x, y}
	}

	// The ranks run together; the collectives, forward and backward, meet.
	var wg sync.WaitGroup
	for r := range ranks {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := ranks[r].prog.Run(ctx); err != nil {
				panic(err)
			}
		}()
	}
	wg.Wait()
	for r, k := range ranks {
		dx, _ := k.prog.Grad(k.x)
		fmt.Printf("rank %d: y = %v, dL/dx = %v\n", r, k.y.Value().Data(), dx.Data())
	}
	for _, pg := range pgs {
		wg.Add(1)
		go func() { defer wg.Done(); pg.Close() }()
	}
	wg.Wait()
	// Output:
	// rank 0: y = [3 5], dL/dx = [0 1]
	// rank 1: y = [3 5], dL/dx = [2 1]
}
