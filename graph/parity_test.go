package graph

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"

	G "gorgonia.org/gorgonia"
	"gorgonia.org/tensor"
)

var parityModels = map[string]builder{
	"mlp":            buildMLP([]int{8, 16, 12, 5}, 6, false),
	"mlp-logsoftmax": buildMLP([]int{10, 7, 4}, 3, true),
	"matmul":         buildMatmul,
	"broadcast":      buildBroadcast,
}

// TestParityWithTapeMachine runs each graph with TapeMachine and with the
// executor (on an identical second copy of the graph) over several runs with
// new data, and compares the cost, the model outputs and every gradient
// elementwise. TapeMachine overwrites some intermediate values in place once
// they are dead (its registers are shared), so every node's value, those
// included, is compared with a plain op-by-op evaluation instead.
func TestParityWithTapeMachine(t *testing.T) {
	for name, build := range parityModels {
		for _, dt := range []tensor.Dtype{tensor.Float64, tensor.Float32} {
			for _, workers := range []int{1, 4} {
				t.Run(fmt.Sprintf("%s/%v/workers=%d", name, dt, workers), func(t *testing.T) {
					ref := build(t, dt)
					mine := build(t, dt)
					tm := G.NewTapeMachine(ref.g)
					defer tm.Close()
					prog, err := Compile(mine.g, Workers(workers), WithGrads(mine.params, mine.grads))
					if err != nil {
						t.Fatal(err)
					}
					rng := rand.New(rand.NewPCG(7, uint64(workers)))
					for run := 0; run < 4; run++ {
						data := ref.dataValues(rng, dt)
						for i, n := range ref.data {
							if err := G.Let(n, cloneValue(t, data[i])); err != nil {
								t.Fatal(err)
							}
						}
						if err := tm.RunAll(); err != nil {
							t.Fatal(err)
						}
						var wantOut, wantGrad []G.Value
						for _, n := range ref.outputs {
							wantOut = append(wantOut, cloneValue(t, n.Value()))
						}
						for _, n := range ref.grads {
							wantGrad = append(wantGrad, cloneValue(t, n.Value()))
						}
						tm.Reset()

						var binds []Binding
						for i, n := range mine.data {
							binds = append(binds, Bind(n, cloneValue(t, data[i])))
						}
						if err := prog.Run(context.Background(), binds...); err != nil {
							t.Fatal(err)
						}
						naive := naiveEval(t, mine.g)
						for _, n := range prog.Nodes() {
							if v := naive[n]; v != nil {
								assertClose(t, fmt.Sprintf("run %d node %q against plain evaluation", run, n.Name()), dt, v, n.Value())
							}
						}
						for i, n := range mine.outputs {
							assertClose(t, fmt.Sprintf("run %d output %q", run, n.Name()), dt, wantOut[i], n.Value())
							assertClose(t, fmt.Sprintf("run %d Program.Value(%q)", run, n.Name()), dt, wantOut[i], prog.Value(n))
						}
						for i, p := range mine.params {
							assertClose(t, fmt.Sprintf("run %d gradient node of %q", run, p.Name()), dt, wantGrad[i], mine.grads[i].Value())
							g, err := prog.Grad(p)
							if err != nil {
								t.Fatal(err)
							}
							assertClose(t, fmt.Sprintf("run %d Program.Grad(%q)", run, p.Name()), dt, wantGrad[i], g)
							ng, err := p.Grad()
							if err != nil {
								t.Fatal(err)
							}
							assertClose(t, fmt.Sprintf("run %d %q.Grad()", run, p.Name()), dt, wantGrad[i], ng)
						}
					}
				})
			}
		}
	}
}
