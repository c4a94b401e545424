package graph

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	G "gorgonia.org/gorgonia"
	"gorgonia.org/tensor"
)

// fanGraph builds x -> k independent probe branches -> their sum.
func fanGraph(t *testing.T, ops []G.Op) (*G.ExprGraph, *G.Node, []*G.Node, *G.Node) {
	t.Helper()
	g := G.NewGraph()
	x := G.NewMatrix(g, tensor.Float64, G.WithShape(2, 2), G.WithName("x"),
		G.WithValue(tensor.New(tensor.WithShape(2, 2), tensor.WithBacking([]float64{1, 2, 3, 4}))))
	var branches []*G.Node
	sum := (*G.Node)(nil)
	for _, op := range ops {
		b := probe(x, op)
		branches = append(branches, b)
		if sum == nil {
			sum = b
		} else {
			sum = G.Must(G.Add(sum, b))
		}
	}
	return g, x, branches, sum
}

// Two independent nodes whose ops each wait for the other to be running at the
// same time: the run only succeeds if the executor overlaps them.
func TestIndependentNodesRunConcurrently(t *testing.T) {
	for _, workers := range []int{2, 4} {
		t.Run(fmt.Sprintf("workers=%d", workers), func(t *testing.T) {
			for run := 0; run < 3; run++ {
				rv := newRendezvous(2, 10*time.Second)
				ops := []G.Op{
					&probeOp{name: fmt.Sprintf("left%d", run), do: rv.wait},
					&probeOp{name: fmt.Sprintf("right%d", run), do: rv.wait},
				}
				g, _, _, sum := fanGraph(t, ops)
				prog, err := Compile(g, Workers(workers))
				if err != nil {
					t.Fatal(err)
				}
				if err := prog.Run(context.Background()); err != nil {
					t.Fatalf("run %d: %v (the two branches did not overlap)", run, err)
				}
				want := []float64{2, 4, 6, 8}
				assertClose(t, "sum", tensor.Float64, tensor.New(tensor.WithShape(2, 2), tensor.WithBacking(want)), sum.Value())
			}
		})
	}
}

// Workers(1) never runs two nodes at once and follows the topological order.
func TestOneWorkerIsSequentialAndOrdered(t *testing.T) {
	var c concurrency
	var ops []G.Op
	for i := range 6 {
		ops = append(ops, &probeOp{name: fmt.Sprint("b", i), do: func(context.Context) error {
			c.enter()
			defer c.leave()
			time.Sleep(time.Millisecond) // give an overlapping node a chance to show
			return nil
		}})
	}
	g, _, _, _ := fanGraph(t, ops)
	prog, err := Compile(g, Workers(1))
	if err != nil {
		t.Fatal(err)
	}
	var order []*G.Node
	var mu sync.Mutex
	prog.OnReady(func(_ context.Context, n *G.Node, _ G.Value) error {
		mu.Lock()
		order = append(order, n)
		mu.Unlock()
		return nil
	})
	var want []*G.Node
	for _, n := range prog.Nodes() {
		if n.Op() != nil {
			want = append(want, n)
		}
	}
	for run := 0; run < 3; run++ {
		order = order[:0]
		if err := prog.Run(context.Background()); err != nil {
			t.Fatal(err)
		}
		if m := c.max.Load(); m != 1 {
			t.Fatalf("run %d: %d nodes ran at once with Workers(1)", run, m)
		}
		var got []*G.Node
		for _, n := range order {
			if n.Op() != nil {
				got = append(got, n)
			}
		}
		if len(got) != len(want) {
			t.Fatalf("run %d: %d nodes ran, want %d", run, len(got), len(want))
		}
		for i := range want {
			if got[i] != want[i] {
				t.Fatalf("run %d: position %d ran %q, topological order has %q", run, i, got[i].Name(), want[i].Name())
			}
		}
	}
}

// With Workers(1) the rendezvous can never complete: the first branch gives up
// alone, which shows the run really is sequential.
func TestOneWorkerCannotOverlap(t *testing.T) {
	rv := newRendezvous(2, 200*time.Millisecond)
	ops := []G.Op{&probeOp{name: "l", do: rv.wait}, &probeOp{name: "r", do: rv.wait}}
	g, _, _, _ := fanGraph(t, ops)
	prog, err := Compile(g, Workers(1))
	if err != nil {
		t.Fatal(err)
	}
	if err := prog.Run(context.Background()); !errors.Is(err, errAlone) {
		t.Fatalf("got %v, want the lone rendezvous to time out", err)
	}
}

// Programs over different graphs can run at the same time (as goroutine ranks
// in one process do), each giving the same results as alone.
func TestSeparateProgramsRunConcurrently(t *testing.T) {
	const ranks = 3
	models := make([]*model, ranks)
	progs := make([]*Program, ranks)
	for r := range models {
		models[r] = buildMLP([]int{6, 9, 9, 3}, 4, true)(t, tensor.Float32)
		p, err := Compile(models[r].g, Workers(2), WithGrads(models[r].params, models[r].grads))
		if err != nil {
			t.Fatal(err)
		}
		progs[r] = p
	}
	rng := rand.New(rand.NewPCG(8, 8))
	data := models[0].dataValues(rng, tensor.Float32)
	var wg sync.WaitGroup
	errc := make(chan error, ranks)
	for r := range ranks {
		wg.Go(func() {
			for range 5 {
				x, _ := G.CloneValue(data[0])
				y, _ := G.CloneValue(data[1])
				if err := progs[r].Run(context.Background(), Bind(models[r].data[0], x), Bind(models[r].data[1], y)); err != nil {
					errc <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errc)
	for err := range errc {
		t.Fatal(err)
	}
	for r := 1; r < ranks; r++ {
		for i := range models[r].grads {
			assertClose(t, fmt.Sprintf("rank %d gradient %d", r, i), tensor.Float32, models[0].grads[i].Value(), models[r].grads[i].Value())
		}
	}
}

// Two backward matrix products transpose the same input at the same time
// (gorgonia's kernels flip the operand's shape in place while they run): each
// op must get its own view of the shared value.
func TestSharedInputTransposedConcurrently(t *testing.T) {
	rng := rand.New(rand.NewPCG(10, 10))
	build := func() (*G.ExprGraph, *G.Node, G.Nodes, G.Nodes) {
		g := G.NewGraph()
		x := G.NewMatrix(g, tensor.Float64, G.WithShape(8, 6), G.WithName("x"))
		var ws G.Nodes
		var cost *G.Node
		for i := range 4 {
			w := param(g, rng, tensor.Float64, fmt.Sprint("w", i), 6, 5)
			ws = append(ws, w)
			s := G.Must(G.Sum(G.Must(G.Tanh(G.Must(G.Mul(x, w))))))
			if cost == nil {
				cost = s
			} else {
				cost = G.Must(G.Add(cost, s))
			}
		}
		grads, err := G.Grad(cost, ws...)
		if err != nil {
			t.Fatal(err)
		}
		return g, x, ws, grads
	}
	g, x, ws, grads := build()
	prog, err := Compile(g, Workers(4))
	if err != nil {
		t.Fatal(err)
	}
	for run := range 5 {
		xv := randDense(rng, tensor.Float64, 8, 6)
		want := plainForward(t, g, map[*G.Node]G.Value{x: xv, ws[0]: ws[0].Value(), ws[1]: ws[1].Value(), ws[2]: ws[2].Value(), ws[3]: ws[3].Value()})
		if err := prog.Run(context.Background(), Bind(x, xv)); err != nil {
			t.Fatal(err)
		}
		for i, gr := range grads {
			assertClose(t, fmt.Sprintf("run %d gradient of w%d", run, i), tensor.Float64, want[gr], gr.Value())
		}
		if !x.Value().Shape().Eq(tensor.Shape{8, 6}) {
			t.Fatalf("run %d: x's shape became %v", run, x.Value().Shape())
		}
	}
}
