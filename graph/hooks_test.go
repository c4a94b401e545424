package graph

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"

	G "gorgonia.org/gorgonia"
	"gorgonia.org/tensor"
)

// dependsOn reports whether a depends (transitively) on b in prog.
func dependsOn(prog *Program, a, b *G.Node) bool {
	seen := map[*G.Node]bool{}
	var walk func(n *G.Node) bool
	walk = func(n *G.Node) bool {
		if n == b {
			return true
		}
		if seen[n] {
			return false
		}
		seen[n] = true
		it := prog.Graph().From(n.ID())
		for it.Next() {
			if walk(it.Node().(*G.Node)) {
				return true
			}
		}
		return false
	}
	return a != b && walk(a)
}

func runModel(t *testing.T, prog *Program, m *model, rng *rand.Rand, dt tensor.Dtype) {
	t.Helper()
	var binds []Binding
	for i, v := range m.dataValues(rng, dt) {
		binds = append(binds, Bind(m.data[i], v))
	}
	if err := prog.Run(context.Background(), binds...); err != nil {
		t.Fatal(err)
	}
}

// Every value-producing node fires its hooks exactly once per run, with the
// value already bound to the node, and only after the hooks of everything it
// reads have fired.
func TestHooksFireOncePerNodeAfterValueIsReady(t *testing.T) {
	for _, workers := range []int{1, 4} {
		t.Run(fmt.Sprintf("workers=%d", workers), func(t *testing.T) {
			m := buildMLP([]int{6, 9, 9, 3}, 4, false)(t, tensor.Float64)
			prog, err := Compile(m.g, Workers(workers), WithGrads(m.params, m.grads))
			if err != nil {
				t.Fatal(err)
			}
			var mu sync.Mutex
			fired := map[*G.Node]int{}
			var problems []string
			prog.OnReady(func(_ context.Context, n *G.Node, v G.Value) error {
				mu.Lock()
				defer mu.Unlock()
				fired[n]++
				if v == nil || n.Value() == nil || !sameMemory(n.Value(), v) {
					problems = append(problems, fmt.Sprintf("%q: hook value %v is not the node's value", n.Name(), v))
				}
				it := prog.Graph().From(n.ID())
				for it.Next() {
					c := it.Node().(*G.Node)
					if fired[c] == 0 {
						problems = append(problems, fmt.Sprintf("%q fired before its input %q", n.Name(), c.Name()))
					}
				}
				return nil
			})
			rng := rand.New(rand.NewPCG(1, 1))
			for run := 1; run <= 3; run++ {
				clear(fired)
				runModel(t, prog, m, rng, tensor.Float64)
				if len(problems) > 0 {
					t.Fatalf("run %d: %s", run, strings.Join(problems, "; "))
				}
				for _, n := range prog.Nodes() {
					if fired[n] != 1 {
						t.Fatalf("run %d: node %q fired %d times, want 1", run, n.Name(), fired[n])
					}
				}
			}
		})
	}
}

// Gradient hooks of parameters fire in an order consistent with the
// dependencies: after everything their gradient node depends on, and before
// the backward pass is over (with Workers(1), the last layer's weight
// gradient is announced before the first layer's is computed), each with the
// final gradient value.
func TestGradHooksFollowDependencies(t *testing.T) {
	for _, workers := range []int{1, 4} {
		t.Run(fmt.Sprintf("workers=%d", workers), func(t *testing.T) {
			m := buildMLP([]int{5, 8, 8, 8, 3}, 4, true)(t, tensor.Float32)
			prog, err := Compile(m.g, Workers(workers), WithGrads(m.params, m.grads))
			if err != nil {
				t.Fatal(err)
			}
			var mu sync.Mutex
			var events []string // "node:NAME" when a node is ready, "grad:NAME" for a gradient hook
			seen := map[*G.Node]G.Value{}
			prog.OnReady(func(_ context.Context, n *G.Node, _ G.Value) error {
				mu.Lock()
				defer mu.Unlock()
				events = append(events, "node:"+n.Name())
				return nil
			})
			for _, p := range m.params {
				err := prog.OnGradReady(p, func(_ context.Context, wrt *G.Node, grad G.Value) error {
					c, err := G.CloneValue(grad)
					if err != nil {
						return err
					}
					mu.Lock()
					defer mu.Unlock()
					events = append(events, "grad:"+wrt.Name())
					seen[wrt] = c
					return nil
				})
				if err != nil {
					t.Fatal(err)
				}
			}
			rng := rand.New(rand.NewPCG(2, 2))
			for run := 0; run < 3; run++ {
				events = events[:0]
				runModel(t, prog, m, rng, tensor.Float32)
				pos := map[string]int{}
				for i, e := range events {
					if _, dup := pos[e]; dup {
						t.Fatalf("run %d: event %s twice", run, e)
					}
					pos[e] = i
				}
				for _, p := range m.params {
					gp, ok := pos["grad:"+p.Name()]
					if !ok {
						t.Fatalf("run %d: gradient hook of %q did not fire", run, p.Name())
					}
					gn := prog.GradNode(p)
					for _, n := range prog.Nodes() {
						if dependsOn(prog, gn, n) && pos["node:"+n.Name()] > gp {
							t.Fatalf("run %d: gradient hook of %q fired before node %q it depends on was ready", run, p.Name(), n.Name())
						}
					}
					g, err := prog.Grad(p)
					if err != nil {
						t.Fatal(err)
					}
					assertClose(t, "hook gradient of "+p.Name(), tensor.Float32, g, seen[p])
				}
				if workers == 1 {
					last, first := m.params[len(m.params)-2], m.params[0]
					if pos["grad:"+last.Name()] > pos["node:"+prog.GradNode(first).Name()] {
						t.Fatalf("run %d: the gradient of %s was announced only after the first layer's gradient was computed", run, last.Name())
					}
				}
			}
		})
	}
}

// A hook's error or panic stops the run and names the node.
func TestHookErrorStopsRun(t *testing.T) {
	m := buildMatmul(t, tensor.Float64)
	prog, err := Compile(m.g, Workers(2), WithGrads(m.params, m.grads))
	if err != nil {
		t.Fatal(err)
	}
	boom := errors.New("hook failed")
	target := m.grads[0]
	if err := prog.OnNodeReady(target, func(context.Context, *G.Node, G.Value) error { return boom }); err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(3, 3))
	vals := m.dataValues(rng, tensor.Float64)
	err = prog.Run(context.Background(), Bind(m.data[0], vals[0]))
	if !errors.Is(err, boom) || !strings.Contains(err.Error(), target.Name()) {
		t.Fatalf("got %v, want the hook's error naming node %q", err, target.Name())
	}

	m2 := buildMatmul(t, tensor.Float64)
	prog2, err := Compile(m2.g)
	if err != nil {
		t.Fatal(err)
	}
	prog2.OnReady(func(_ context.Context, n *G.Node, _ G.Value) error {
		if n == m2.cost {
			panic("hook panic")
		}
		return nil
	})
	err = prog2.Run(context.Background(), Bind(m2.data[0], vals[0]))
	var pe *PanicError
	if !errors.Is(err, ErrPanic) || !errors.As(err, &pe) || pe.Value != "hook panic" {
		t.Fatalf("got %v, want a PanicError from the hook", err)
	}
}

func TestHookRegistrationErrors(t *testing.T) {
	m := buildMatmul(t, tensor.Float64)
	prog, err := Compile(m.g)
	if err != nil {
		t.Fatal(err)
	}
	other := G.NewScalar(G.NewGraph(), tensor.Float64, G.WithName("elsewhere"))
	if err := prog.OnNodeReady(other, func(context.Context, *G.Node, G.Value) error { return nil }); !errors.Is(err, ErrInvalidArgument) {
		t.Fatalf("hook on a foreign node: got %v, want ErrInvalidArgument", err)
	}
	if err := prog.OnGradReady(m.data[0], func(context.Context, *G.Node, G.Value) error { return nil }); !errors.Is(err, ErrInvalidArgument) {
		t.Fatalf("gradient hook on a node without gradient: got %v, want ErrInvalidArgument", err)
	}
	if err := prog.OnNodeReady(m.cost, nil); !errors.Is(err, ErrInvalidArgument) {
		t.Fatalf("nil hook: got %v, want ErrInvalidArgument", err)
	}
}

type ctxKey struct{}

// Hooks get the context given to Run, still live after Run returns, so work
// they hand off is not cancelled by the end of the run.
func TestHooksGetCallersContext(t *testing.T) {
	for _, workers := range []int{1, 4} {
		t.Run(fmt.Sprintf("workers=%d", workers), func(t *testing.T) {
			m := buildMatmul(t, tensor.Float64)
			prog, err := Compile(m.g, Workers(workers), WithGrads(m.params, m.grads))
			if err != nil {
				t.Fatal(err)
			}
			var got []context.Context
			var mu sync.Mutex
			if err := prog.OnGradReady(m.params[0], func(ctx context.Context, _ *G.Node, _ G.Value) error {
				mu.Lock()
				got = append(got, ctx)
				mu.Unlock()
				return nil
			}); err != nil {
				t.Fatal(err)
			}
			ctx := context.WithValue(context.Background(), ctxKey{}, "mine")
			rng := rand.New(rand.NewPCG(6, 6))
			if err := prog.Run(ctx, Bind(m.data[0], m.dataValues(rng, tensor.Float64)[0])); err != nil {
				t.Fatal(err)
			}
			if len(got) != 1 || got[0].Value(ctxKey{}) != "mine" || got[0].Err() != nil {
				t.Fatalf("hook contexts %v: want the caller's, still live", got)
			}
		})
	}
}
