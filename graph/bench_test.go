package graph

import (
	"context"
	"fmt"
	"math/rand/v2"
	"runtime"
	"testing"

	G "gorgonia.org/gorgonia"
	"gorgonia.org/tensor"

	"github.com/tandemml/tandem/internal/cputime"
)

// trainStep is one benchmark configuration: an MLP, its data, and a step
// function doing forward, backward and an in-place SGD update.
type trainBench struct {
	m    *model
	x, y G.Value
}

func newTrainBench(tb testing.TB, sizes []int, batch int) *trainBench {
	m := buildMLP(sizes, batch, true)(tb, tensor.Float32)
	rng := rand.New(rand.NewPCG(11, 12))
	vals := m.dataValues(rng, tensor.Float32)
	return &trainBench{m: m, x: vals[0], y: vals[1]}
}

// sgd does w -= lr*g for every parameter.
func (b *trainBench) sgd(tb testing.TB, grads []G.Value) {
	const lr = 1e-3
	for i, p := range b.m.params {
		w := p.Value().Data().([]float32)
		g := grads[i].Data().([]float32)
		if len(w) != len(g) {
			tb.Fatalf("param %s: %d weights, %d gradients", p.Name(), len(w), len(g))
		}
		for j := range w {
			w[j] -= lr * g[j]
		}
	}
}

func (b *trainBench) tapeStep(tb testing.TB) func() {
	tm := G.NewTapeMachine(b.m.g)
	grads := make([]G.Value, len(b.m.grads))
	return func() {
		if err := G.Let(b.m.data[0], b.x); err != nil {
			tb.Fatal(err)
		}
		if err := G.Let(b.m.data[1], b.y); err != nil {
			tb.Fatal(err)
		}
		if err := tm.RunAll(); err != nil {
			tb.Fatal(err)
		}
		for i, n := range b.m.grads {
			grads[i] = n.Value()
		}
		b.sgd(tb, grads)
		tm.Reset()
	}
}

func (b *trainBench) programStep(tb testing.TB, opts ...Option) func() {
	prog, err := Compile(b.m.g, append(opts, WithGrads(b.m.params, b.m.grads))...)
	if err != nil {
		tb.Fatal(err)
	}
	ctx := context.Background()
	grads := make([]G.Value, len(b.m.grads))
	bx, by := Bind(b.m.data[0], b.x), Bind(b.m.data[1], b.y)
	return func() {
		if err := prog.Run(ctx, bx, by); err != nil {
			tb.Fatal(err)
		}
		for i, p := range b.m.params {
			g, err := prog.Grad(p)
			if err != nil {
				tb.Fatal(err)
			}
			grads[i] = g
		}
		b.sgd(tb, grads)
	}
}

// BenchmarkTrainStep times one training step (forward, backward, SGD update)
// of a 784-1024-1024-10 MLP on a batch of 64 float32 samples, with
// TapeMachine and with the executor.
func BenchmarkTrainStep(b *testing.B) {
	sizes, batch := []int{784, 1024, 1024, 10}, 64
	run := func(b *testing.B, step func()) {
		step() // warm up: first-run allocations
		b.ReportAllocs()
		b.ResetTimer()
		c0 := cputime.Process()
		for range b.N {
			step()
		}
		// CPU time is less sensitive than wall time to other processes on a
		// shared machine (it includes every thread of this process).
		b.ReportMetric(float64((cputime.Process()-c0).Microseconds())/1e3/float64(b.N), "cpu-ms/op")
	}
	b.Run("tapemachine", func(b *testing.B) {
		tb := newTrainBench(b, sizes, batch)
		run(b, tb.tapeStep(b))
	})
	for _, w := range []int{1, runtime.GOMAXPROCS(0)} {
		b.Run(fmt.Sprintf("executor/workers=%d", w), func(b *testing.B) {
			tb := newTrainBench(b, sizes, batch)
			run(b, tb.programStep(b, Workers(w)))
		})
	}
	b.Run("executor/no-reuse", func(b *testing.B) {
		tb := newTrainBench(b, sizes, batch)
		run(b, tb.programStep(b, ReuseBuffers(false)))
	})
}
