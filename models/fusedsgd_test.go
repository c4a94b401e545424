package models

import (
	"context"
	"errors"
	"math"
	"math/rand/v2"
	"testing"

	G "gorgonia.org/gorgonia"
	"gorgonia.org/tensor"

	"github.com/tandemml/tandem/graph"
	"github.com/tandemml/tandem/internal/errs"
)

// sgdStep is the reference update: p ← p − lr·g for every parameter.
func sgdStep(ps []*Param, lr float64) {
	for _, p := range ps {
		switch v := p.Value.Data().(type) {
		case []float64:
			for i, g := range p.Grad.Float64s() {
				v[i] -= lr * g
			}
		case []float32:
			for i, g := range p.Grad.Float32s() {
				v[i] -= float32(lr) * g
			}
		}
	}
}

// fusedStepper builds the MLP's training step with opts and returns the
// builder, the program and the loss node.
func fusedStepper(t *testing.T, m Module, x, y *tensor.Dense, workers int, opts ...BuilderOption) (*Builder, *graph.Program, *G.Node) {
	t.Helper()
	b := NewBuilder(nil, opts...)
	logits, err := m.Forward(b, b.Bind("x", x))
	if err != nil {
		t.Fatal(err)
	}
	loss, err := CrossEntropy(logits, b.Bind("y", y))
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Backward(loss); err != nil {
		t.Fatal(err)
	}
	prog, err := b.Compile(graph.Workers(workers))
	if err != nil {
		t.Fatal(err)
	}
	return b, prog, loss
}

// TestSGDInBackward: a program compiled with WithSGDInBackward updates the
// Linear weights itself, the biases are left to the caller, and ten steps
// give the parameters and losses of the plain loop (ZeroGrad, run,
// CopyGrads, SGD) to rounding, sequentially and with parallel workers, in
// float64 and float32. The fused weights keep no gradient.
func TestSGDInBackward(t *testing.T) {
	const lr = 0.1
	for _, dt := range []tensor.Dtype{tensor.Float64, tensor.Float32} {
		for _, workers := range []int{1, 3} {
			t.Run(dt.String()+"/workers"+string(rune('0'+workers)), func(t *testing.T) {
				tol := 1e-12
				if dt == tensor.Float32 {
					tol = 1e-5
				}
				mk := func() Module {
					m, err := NewMLP([]int{12, 16, 16, 5}, WithRand(rand.New(rand.NewPCG(5, 6))), WithDtype(dt))
					if err != nil {
						t.Fatal(err)
					}
					return m
				}
				rng := rand.New(rand.NewPCG(9, 10))
				x := randDense(rng, dt, 8, 12)
				y := tensor.New(tensor.WithShape(8), tensor.WithBacking([]int64{0, 1, 2, 3, 4, 0, 1, 2}))
				plainM, fusedM := mk(), mk()
				pb, pprog, ploss := fusedStepper(t, plainM, x, y, workers)
				fb, fprog, floss := fusedStepper(t, fusedM, x, y, workers, WithSGDInBackward(lr), WithGradsInPlace())

				fused, rest := fb.SGDInBackward()
				if len(fused) != 3 || len(rest) != 3 {
					t.Fatalf("fused %d parameters and left %d, want the 3 weights and the 3 biases", len(fused), len(rest))
				}
				for _, p := range fused {
					if p.Value.Shape().Dims() != 2 {
						t.Errorf("fused parameter %s has shape %v, want a weight matrix", p.Name, p.Value.Shape())
					}
				}
				if fb.SetGradTarget(fprog, fused[0], newDense(dt, fused[0].Value.Shape()...), 0) {
					t.Error("SetGradTarget took a target for a parameter the run updates itself")
				}
				for step := 0; step < 10; step++ {
					if err := pprog.Run(context.Background()); err != nil {
						t.Fatal(err)
					}
					if err := pb.CopyGrads(); err != nil {
						t.Fatal(err)
					}
					sgdStep(plainM.Params(), lr)
					if err := fprog.Run(context.Background()); err != nil {
						t.Fatal(err)
					}
					if err := fb.CopyGrads(); err != nil {
						t.Fatal(err)
					}
					sgdStep(rest, lr)
					if a, b := lossOf(t, ploss.Value()), lossOf(t, floss.Value()); math.Abs(a-b) > tol*math.Max(1, math.Abs(a)) {
						t.Fatalf("step %d: loss %v fused, %v plain", step, b, a)
					}
				}
				pp, fp := plainM.Params(), fusedM.Params()
				for i := range pp {
					want, got := toFloat64s(pp[i].Value), toFloat64s(fp[i].Value)
					for j := range want {
						if math.Abs(want[j]-got[j]) > tol*math.Max(1, math.Abs(want[j])) {
							t.Fatalf("%s[%d] = %v after ten fused steps, %v after ten plain ones", pp[i].Name, j, got[j], want[j])
						}
					}
				}
				for _, p := range fused {
					if p.Grad != nil {
						t.Errorf("fused parameter %s has a gradient tensor; the run keeps none", p.Name)
					}
				}
			})
		}
	}
}

// TestSGDInBackwardRefused: a learning rate that is negative or NaN is
// refused at Compile; without Backward nothing is fused.
func TestSGDInBackwardRefused(t *testing.T) {
	m, err := NewMLP([]int{4, 3}, WithRand(rand.New(rand.NewPCG(1, 1))), WithDtype(tensor.Float64))
	if err != nil {
		t.Fatal(err)
	}
	for _, lr := range []float64{-0.1, math.NaN()} {
		b := NewBuilder(nil, WithSGDInBackward(lr))
		out, err := m.Forward(b, b.Bind("x", tensor.New(tensor.WithShape(2, 4), tensor.WithBacking(make([]float64, 8)))))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := G.Sum(out); err != nil {
			t.Fatal(err)
		}
		if _, err := b.Compile(); !errors.Is(err, errs.InvalidArgument) {
			t.Errorf("WithSGDInBackward(%v): Compile gave %v, want an invalid-argument error", lr, err)
		}
	}
	b := NewBuilder(nil, WithSGDInBackward(0.1))
	if _, err := m.Forward(b, b.Bind("x", tensor.New(tensor.WithShape(2, 4), tensor.WithBacking(make([]float64, 8))))); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Compile(); err != nil {
		t.Fatal(err)
	}
	if fused, rest := b.SGDInBackward(); len(fused)+len(rest) != 0 {
		t.Errorf("without Backward: %d fused and %d other parameters, want none", len(fused), len(rest))
	}
}

func lossOf(t *testing.T, v G.Value) float64 {
	t.Helper()
	f, err := scalarOf(v)
	if err != nil {
		t.Fatal(err)
	}
	return f
}
