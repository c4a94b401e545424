package graph

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"

	G "gorgonia.org/gorgonia"
	"gorgonia.org/tensor"
)

// BindDualValues behaves as TapeMachine's option: gradients accumulate in the
// parameters' dual values over runs, gorgonia's solvers read and zero them,
// and the parameters after several solver steps agree with TapeMachine's.
func TestBindDualValuesMatchesTapeMachine(t *testing.T) {
	for _, explicit := range []bool{true, false} {
		for _, workers := range []int{1, 4} {
			t.Run(fmt.Sprintf("explicit=%v/workers=%d", explicit, workers), func(t *testing.T) {
				dt := tensor.Float64
				build := buildMLP([]int{5, 7, 3}, 4, false)
				ref, mine := build(t, dt), build(t, dt)
				tm := G.NewTapeMachine(ref.g, G.BindDualValues(ref.params...))
				defer tm.Close()
				opts := []Option{Workers(workers), WithGrads(mine.params, mine.grads), BindDualValues()}
				if explicit {
					opts[2] = BindDualValues(mine.params...)
				}
				prog, err := Compile(mine.g, opts...)
				if err != nil {
					t.Fatal(err)
				}
				refSolver := G.NewVanillaSolver(G.WithLearnRate(0.1))
				mySolver := G.NewVanillaSolver(G.WithLearnRate(0.1))
				rng := rand.New(rand.NewPCG(9, 9))
				for step := 0; step < 3; step++ {
					// Two runs before each solver step: gradients accumulate.
					for micro := 0; micro < 2; micro++ {
						data := ref.dataValues(rng, dt)
						for i, n := range ref.data {
							if err := G.Let(n, cloneValue(t, data[i])); err != nil {
								t.Fatal(err)
							}
						}
						if err := tm.RunAll(); err != nil {
							t.Fatal(err)
						}
						tm.Reset()
						var binds []Binding
						for i, n := range mine.data {
							binds = append(binds, Bind(n, cloneValue(t, data[i])))
						}
						if err := prog.Run(context.Background(), binds...); err != nil {
							t.Fatal(err)
						}
						for i, p := range mine.params {
							want, err := ref.params[i].Grad()
							if err != nil {
								t.Fatal(err)
							}
							got, err := p.Grad()
							if err != nil {
								t.Fatal(err)
							}
							assertClose(t, fmt.Sprintf("step %d run %d accumulated gradient of %q", step, micro, p.Name()), dt, want, got)
						}
					}
					if err := refSolver.Step(G.NodesToValueGrads(ref.params)); err != nil {
						t.Fatal(err)
					}
					if err := mySolver.Step(G.NodesToValueGrads(mine.params)); err != nil {
						t.Fatal(err)
					}
					for i, p := range mine.params {
						assertClose(t, fmt.Sprintf("step %d parameter %q", step, p.Name()), dt, ref.params[i].Value(), p.Value())
					}
				}
			})
		}
	}
}

// gorgonia.Read works as with TapeMachine: the value is copied out.
func TestReadStatement(t *testing.T) {
	g := G.NewGraph()
	x := G.NewVector(g, tensor.Float64, G.WithShape(3), G.WithName("x"))
	s := G.Must(G.Sum(G.Must(G.Square(x))))
	var out G.Value
	G.Read(s, &out)
	prog, err := Compile(g)
	if err != nil {
		t.Fatal(err)
	}
	for i, want := range []float64{14, 77} {
		base := float64(1 + 3*i)
		xv := tensor.New(tensor.WithShape(3), tensor.WithBacking([]float64{base, base + 1, base + 2}))
		if err := prog.Run(context.Background(), Bind(x, xv)); err != nil {
			t.Fatal(err)
		}
		if out == nil || out.Data().(float64) != want {
			t.Fatalf("run %d: read %v, want %v", i, out, want)
		}
	}
}
