package models

import (
	"context"
	"math"
	"math/rand/v2"
	"testing"

	G "gorgonia.org/gorgonia"
	"gorgonia.org/tensor"

	"github.com/tandemml/tandem/graph"
)

// TestSetGradTarget: gradients of Linear, Conv2d and LayerNorm parameters
// are computed straight into the tensors given, times the scale, equal to
// the scaled gradients of a Builder without targets; a tensor of the wrong
// shape is refused, and a nil target gives the executor its buffer back.
func TestSetGradTarget(t *testing.T) {
	build := func(dt tensor.Dtype) *Sequential {
		r := rand.New(rand.NewPCG(17, 18))
		c, _ := NewConv2d(1, 2, 3, WithPadding(1, 1), WithRand(r), WithDtype(dt))
		ln, _ := NewLayerNorm([]int{2 * 4 * 4}, WithDtype(dt))
		l1, _ := NewLinear(2*4*4, 5, WithRand(r), WithDtype(dt))
		return NewSequential(c, ReLU{}, Flatten{}, ln, l1)
	}
	rng := rand.New(rand.NewPCG(5, 6))
	for _, dt := range []tensor.Dtype{tensor.Float64, tensor.Float32} {
		for _, scale := range []float64{0.5, 1.0 / 3} {
			mt, md := build(dt), build(dt)
			x := randDense(rng, dt, 3, 1, 4, 4)
			lab := tensor.New(tensor.WithShape(3), tensor.WithBacking([]int64{4, 0, 1}))
			bt := NewBuilder(nil)
			yt, err := mt.Forward(bt, bt.Bind("x", x))
			if err != nil {
				t.Fatal(err)
			}
			lt, _ := CrossEntropy(yt, bt.Bind("y", lab))
			if err := bt.Backward(lt); err != nil {
				t.Fatal(err)
			}
			bd, _ := trainGraph(t, md, x, lab)
			pt, err := graph.Compile(bt.Graph(), graph.Workers(1))
			if err != nil {
				t.Fatal(err)
			}
			targets := map[*Param]*tensor.Dense{}
			for _, p := range mt.Params() {
				dst := tensor.New(tensor.Of(dt), tensor.WithShape(p.Value.Shape().Clone()...))
				if !bt.SetGradTarget(pt, p, dst, scale) {
					t.Fatalf("%s: the target was refused", p.Name)
				}
				targets[p] = dst
			}
			wrong := tensor.New(tensor.Of(dt), tensor.WithShape(7))
			if bt.SetGradTarget(pt, mt.Params()[0], wrong, 1) {
				t.Fatal("a target of the wrong shape was taken")
			}
			bt.SetGradTarget(pt, mt.Params()[0], targets[mt.Params()[0]], scale)
			pd, err := graph.Compile(bd.Graph(), graph.Workers(1))
			if err != nil {
				t.Fatal(err)
			}
			for step := 0; step < 2; step++ {
				if err := pt.Run(context.Background()); err != nil {
					t.Fatal(err)
				}
				if err := pd.Run(context.Background()); err != nil {
					t.Fatal(err)
				}
				if err := bd.CopyGrads(); err != nil {
					t.Fatal(err)
				}
				for i, p := range mt.Params() {
					n := bt.GradNode(p)
					if v := n.Value(); v.Uintptr() != targets[p].Uintptr() {
						t.Fatalf("%v %s: the gradient node's value is not the target", dt, p.Name)
					}
					checkScaled(t, p.Name, targets[p], md.Params()[i].Grad, scale)
				}
			}
			// Off again: the gradients land elsewhere, unscaled.
			for _, p := range mt.Params() {
				if !bt.SetGradTarget(pt, p, nil, 0) {
					t.Fatalf("%s: clearing the target failed", p.Name)
				}
			}
			if err := pt.Run(context.Background()); err != nil {
				t.Fatal(err)
			}
			if err := bt.CopyGrads(); err != nil {
				t.Fatal(err)
			}
			for i, p := range mt.Params() {
				if bt.GradNode(p).Value().Uintptr() == targets[p].Uintptr() {
					t.Fatalf("%s: still written into the old target", p.Name)
				}
				checkScaled(t, p.Name, p.Grad, md.Params()[i].Grad, 1)
			}
		}
	}
}

// checkScaled fails unless got equals scale·want to the dtype's rounding.
func checkScaled(t *testing.T, name string, got, want *tensor.Dense, scale float64) {
	t.Helper()
	tol := 1e-13
	if got.Dtype() == tensor.Float32 {
		tol = 1e-5
	}
	g, w := toFloat64s(got), toFloat64s(want)
	for i := range g {
		if d := math.Abs(g[i] - scale*w[i]); d > tol*math.Max(1, math.Abs(w[i])) {
			t.Fatalf("%s[%d] = %v, want %v·%v", name, i, g[i], scale, w[i])
		}
	}
}

var _ G.Value = (*tensor.Dense)(nil)
