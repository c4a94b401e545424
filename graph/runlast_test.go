package graph

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"

	G "gorgonia.org/gorgonia"
	"gorgonia.org/tensor"
)

// TestRunLast: the gradient nodes given to RunLast complete after every
// other node, in the order given, sequentially and with several workers,
// and the values are those of a program without RunLast.
func TestRunLast(t *testing.T) {
	for _, workers := range []int{1, 4} {
		t.Run(fmt.Sprintf("workers=%d", workers), func(t *testing.T) {
			m := buildMLP([]int{6, 9, 9, 3}, 4, false)(t, tensor.Float64)
			last := G.Nodes{m.grads[0], m.grads[len(m.grads)-1]}
			prog, err := Compile(m.g, Workers(workers), WithGrads(m.params, m.grads), RunLast(last...))
			if err != nil {
				t.Fatal(err)
			}
			var mu sync.Mutex
			var order []*G.Node
			prog.OnReady(func(_ context.Context, n *G.Node, _ G.Value) error {
				mu.Lock()
				order = append(order, n)
				mu.Unlock()
				return nil
			})
			runModel(t, prog, m, rand.New(rand.NewPCG(1, 2)), tensor.Float64)
			got := make(map[*G.Node]G.Value, len(m.grads))
			for _, g := range m.grads {
				got[g] = g.Value().(*tensor.Dense).Clone().(G.Value)
			}
			if n := len(order); n < 2 || order[n-2] != last[0] || order[n-1] != last[1] {
				t.Fatalf("the RunLast nodes did not complete last, in their order (%d nodes completed)", n)
			}
			ref, err := Compile(m.g, Workers(1), WithGrads(m.params, m.grads))
			if err != nil {
				t.Fatal(err)
			}
			runModel(t, ref, m, rand.New(rand.NewPCG(1, 2)), tensor.Float64)
			for _, g := range m.grads {
				if !g.Value().(*tensor.Dense).Eq(got[g]) {
					t.Errorf("gradient %s differs from a program without RunLast", g.Name())
				}
			}
		})
	}
}

// TestRunLastRefused: an input, a node something reads, a node given twice
// and a node of another graph are refused.
func TestRunLastRefused(t *testing.T) {
	m := buildMLP([]int{6, 9, 3}, 4, false)(t, tensor.Float64)
	other := buildMLP([]int{2, 2}, 1, false)(t, tensor.Float64)
	var read *G.Node // a computed node that another node reads
	for _, n := range m.g.AllNodes() {
		if n.Op() != nil && m.g.To(n.ID()).Len() > 0 {
			read = n
			break
		}
	}
	if read == nil {
		t.Fatal("no computed node with a reader in the graph")
	}
	for name, nodes := range map[string]G.Nodes{
		"input":      {m.params[0]},
		"read":       {read},
		"twice":      {m.grads[0], m.grads[0]},
		"otherGraph": {other.grads[0]},
	} {
		if _, err := Compile(m.g, RunLast(nodes...)); !errors.Is(err, ErrInvalidArgument) {
			t.Errorf("%s: Compile gave %v, want ErrInvalidArgument", name, err)
		}
	}
	if _, err := Compile(m.g, RunLast(nil)); !errors.Is(err, ErrInvalidArgument) {
		t.Errorf("a nil node: Compile gave %v, want ErrInvalidArgument", err)
	}
}
