package graph

import (
	"context"
	"errors"
	"fmt"
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
