package graph

import (
	"context"
	"fmt"
	"math/rand/v2"
	"runtime"
	"strings"
	"testing"

	G "gorgonia.org/gorgonia"
	"gorgonia.org/tensor"
)

// bytesPerRun measures the bytes allocated by one call of f, averaged.
func bytesPerRun(runs int, f func()) float64 {
	var a, b runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&a)
	for range runs {
		f()
	}
	runtime.ReadMemStats(&b)
	return float64(b.TotalAlloc-a.TotalAlloc) / float64(runs)
}

// The executor keeps output buffers between runs: a training step allocates
// fewer objects and far fewer bytes than TapeMachine's. (What remains is
// allocated inside gorgonia's and gonum's kernels.)
func TestAllocationsPerRunBelowTapeMachine(t *testing.T) {
	sizes, batch := []int{32, 64, 64, 10}, 16
	tapeStep := newTrainBench(t, sizes, batch).tapeStep(t)
	mineStep := newTrainBench(t, sizes, batch).programStep(t, Workers(1))
	tapeStep()
	mineStep()
	tapeAllocs := testing.AllocsPerRun(10, tapeStep)
	mineAllocs := testing.AllocsPerRun(10, mineStep)
	tapeBytes := bytesPerRun(10, tapeStep)
	mineBytes := bytesPerRun(10, mineStep)
	t.Logf("per step: TapeMachine %.0f allocs, %.0f bytes; executor %.0f allocs, %.0f bytes", tapeAllocs, tapeBytes, mineAllocs, mineBytes)
	if mineAllocs >= tapeAllocs*0.75 {
		t.Errorf("executor allocates %.0f objects per step, TapeMachine %.0f: want at most 3/4", mineAllocs, tapeAllocs)
	}
	if mineBytes >= tapeBytes/3 {
		t.Errorf("executor allocates %.0f bytes per step, TapeMachine %.0f: want under a third", mineBytes, tapeBytes)
	}
}

// matmulNodes returns the matrix-product nodes of a program.
func matmulNodes(prog *Program) []*G.Node {
	var out []*G.Node
	for _, n := range prog.Nodes() {
		if n.Op() != nil && strings.Contains(n.Op().String(), "×") {
			out = append(out, n)
		}
	}
	return out
}

// Matrix products (which support preallocation) write into the same buffer
// run after run; without reuse they get fresh memory every run.
func TestBuffersKeptAcrossRuns(t *testing.T) {
	for _, reuse := range []bool{true, false} {
		for _, workers := range []int{1, 4} {
			t.Run(fmt.Sprintf("reuse=%v/workers=%d", reuse, workers), func(t *testing.T) {
				m := buildMLP([]int{6, 9, 9, 3}, 4, false)(t, tensor.Float32)
				prog, err := Compile(m.g, Workers(workers), ReuseBuffers(reuse))
				if err != nil {
					t.Fatal(err)
				}
				mm := matmulNodes(prog)
				if len(mm) < 6 {
					t.Fatalf("found %d matrix products, want at least 6", len(mm))
				}
				rng := rand.New(rand.NewPCG(4, 4))
				runModel(t, prog, m, rng, tensor.Float32)
				first := map[*G.Node]uintptr{}
				for _, n := range mm {
					first[n] = n.Value().Uintptr()
				}
				for run := 2; run <= 4; run++ {
					runModel(t, prog, m, rng, tensor.Float32)
					naive := naiveEval(t, m.g)
					for _, n := range mm {
						kept := n.Value().Uintptr() == first[n]
						if kept != reuse {
							t.Fatalf("run %d: node %q kept its buffer: %v, want %v", run, n.Name(), kept, reuse)
						}
						assertClose(t, fmt.Sprintf("run %d node %q", run, n.Name()), tensor.Float32, naive[n], n.Value())
					}
				}
			})
		}
	}
}

// Runs never write into input values, even when an input is fed the output
// buffer of the previous run.
func TestInputsAreNeverOverwritten(t *testing.T) {
	for _, workers := range []int{1, 4} {
		t.Run(fmt.Sprintf("workers=%d", workers), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(5, 5))
			g := G.NewGraph()
			x := G.NewMatrix(g, tensor.Float64, G.WithShape(4, 4), G.WithName("x"))
			w := param(g, rng, tensor.Float64, "w", 4, 4)
			xw := G.Must(G.Mul(x, w))
			h := G.Must(G.Tanh(xw))
			out := G.Must(G.Add(G.Must(G.Mul(h, w)), x))
			prog, err := Compile(g, Workers(workers))
			if err != nil {
				t.Fatal(err)
			}
			xv := randDense(rng, tensor.Float64, 4, 4)
			for run := 0; run < 4; run++ {
				xs := cloneValue(t, xv)
				ws := cloneValue(t, w.Value())
				want := plainForward(t, g, map[*G.Node]G.Value{x: xs, w: ws})
				if err := prog.Run(context.Background(), Bind(x, xv)); err != nil {
					t.Fatal(err)
				}
				assertClose(t, "x after the run", tensor.Float64, xs, xv)
				assertClose(t, "w after the run", tensor.Float64, ws, w.Value())
				for _, n := range []*G.Node{xw, h, out} {
					assertClose(t, fmt.Sprintf("run %d node %q", run, n.Name()), tensor.Float64, want[n], n.Value())
				}
				// Feed an output buffer back in as the next input: the program
				// must stop writing into it.
				next := []G.Value{xw.Value(), h.Value(), out.Value()}
				xv = next[run%3].(*tensor.Dense)
			}
		})
	}
}

// plainForward evaluates g with plain op.Do calls on copies of the given
// input values, leaving the graph's own values alone.
func plainForward(t *testing.T, g *G.ExprGraph, inputs map[*G.Node]G.Value) map[*G.Node]G.Value {
	t.Helper()
	sorted, err := G.Sort(g)
	if err != nil {
		t.Fatal(err)
	}
	vals := map[*G.Node]G.Value{}
	for i := len(sorted) - 1; i >= 0; i-- {
		n := sorted[i]
		if v, ok := inputs[n]; ok {
			vals[n] = cloneValue(t, v)
			continue
		}
		var args []G.Value
		it := g.From(n.ID())
		for it.Next() {
			args = append(args, vals[it.Node().(*G.Node)])
		}
		v, err := n.Op().Do(args...)
		if err != nil {
			t.Fatal(err)
		}
		vals[n] = v
	}
	return vals
}

// An op that returned a view of its input is never handed that memory as a
// buffer to write into.
func TestViewsAreNotReused(t *testing.T) {
	for _, workers := range []int{1, 4} {
		t.Run(fmt.Sprintf("workers=%d", workers), func(t *testing.T) {
			factor := 1.0
			g := G.NewGraph()
			x := G.NewMatrix(g, tensor.Float64, G.WithShape(2, 3), G.WithName("x"),
				G.WithValue(tensor.New(tensor.WithShape(2, 3), tensor.WithBacking([]float64{1, 2, 3, 4, 5, 6}))))
			th := G.Must(G.Add(x, x)) // an op writing into a kept buffer
			sc := G.Must(G.ApplyOp(scaleOp{&factor}, th))
			out := G.Must(G.Sum(sc))
			prog, err := Compile(g, Workers(workers))
			if err != nil {
				t.Fatal(err)
			}
			for run, f := range []float64{1, 2, 3, 1, 2} {
				factor = f
				if err := prog.Run(context.Background()); err != nil {
					t.Fatal(err)
				}
				naive := naiveEval(t, g)
				for _, n := range []*G.Node{th, sc, out} {
					assertClose(t, fmt.Sprintf("run %d (factor %v) node %q", run, f, n.Name()), tensor.Float64, naive[n], n.Value())
				}
			}
		})
	}
}

// An op implementing ContextDoer is offered its previous output as the buffer
// to write into.
func TestContextDoerGetsItsBuffer(t *testing.T) {
	for _, workers := range []int{1, 4} {
		t.Run(fmt.Sprintf("workers=%d", workers), func(t *testing.T) {
			op := &ctxProbeOp{probeOp: probeOp{name: "ctx"}}
			g, nodes := chainGraph(t, op, &probeOp{name: "tail"})
			prog, err := Compile(g, Workers(workers))
			if err != nil {
				t.Fatal(err)
			}
			x, c := nodes[0], nodes[1]
			var first uintptr
			for run := 0; run < 3; run++ {
				xv := tensor.New(tensor.WithShape(2, 2), tensor.WithBacking([]float64{1, 2, 3, float64(run)}))
				if err := prog.Run(context.Background(), Bind(x, xv)); err != nil {
					t.Fatal(err)
				}
				assertClose(t, fmt.Sprintf("run %d", run), tensor.Float64, xv, c.Value())
				if run == 0 {
					first = c.Value().Uintptr()
					if op.prealloc[0] != nil {
						t.Fatal("first run offered a buffer")
					}
					continue
				}
				if pre := op.prealloc[run]; pre == nil || pre.Uintptr() != first || c.Value().Uintptr() != first {
					t.Fatalf("run %d: offered %v, want the first run's output", run, pre)
				}
			}
		})
	}
}
