package models

import (
	"math"
	"math/rand/v2"
	"testing"

	G "gorgonia.org/gorgonia"
	"gorgonia.org/tensor"
)

func TestLinearShapesNamesInit(t *testing.T) {
	l, err := NewLinear(400, 30, WithRand(rand.New(rand.NewPCG(1, 2))), WithDtype(tensor.Float64))
	if err != nil {
		t.Fatal(err)
	}
	if got := l.Weight.Value.Shape(); !got.Eq(tensor.Shape{30, 400}) {
		t.Errorf("weight shape %v, want [30 400]", got)
	}
	if got := l.Bias.Value.Shape(); !got.Eq(tensor.Shape{30}) {
		t.Errorf("bias shape %v, want [30]", got)
	}
	if l.Weight.Name != "weight" || l.Bias.Name != "bias" || !l.Weight.RequiresGrad {
		t.Errorf("names %q %q", l.Weight.Name, l.Bias.Name)
	}
	// U(-1/√400, 1/√400) = U(-0.05, 0.05): all inside, spread over the range,
	// variance bound²/3.
	for _, p := range l.Params() {
		d := p.Value.Float64s()
		var mx, sum, sq float64
		for _, v := range d {
			mx = math.Max(mx, math.Abs(v))
			sum += v
			sq += v * v
		}
		n := float64(len(d))
		if mx > 0.05 || mx < 0.04 {
			t.Errorf("%s: max |w| = %v, want close to but below 0.05", p.Name, mx)
		}
		if p.Name == "weight" {
			if mean := sum / n; math.Abs(mean) > 0.002 {
				t.Errorf("weight mean %v", mean)
			}
			if v := sq / n; math.Abs(v-0.05*0.05/3) > 0.05*0.05/3*0.05 {
				t.Errorf("weight variance %v, want %v", v, 0.05*0.05/3)
			}
		}
	}
	nb, err := NewLinear(3, 2, WithBias(false), WithDtype(tensor.Float32))
	if err != nil {
		t.Fatal(err)
	}
	if len(nb.Params()) != 1 || nb.Weight.Value.Dtype() != tensor.Float32 {
		t.Errorf("no-bias float32 Linear: %d params, dtype %v", len(nb.Params()), nb.Weight.Value.Dtype())
	}
	if _, err := NewLinear(0, 3, WithDtype(tensor.Float64)); err == nil {
		t.Error("NewLinear(0, 3, WithDtype(tensor.Float64)) succeeded")
	}
}

func TestLinearForwardByHand(t *testing.T) {
	l, err := NewLinear(3, 2, WithDtype(tensor.Float64))
	if err != nil {
		t.Fatal(err)
	}
	copy(l.Weight.Value.Float64s(), []float64{1, 2, 3, -1, 0.5, 2})
	copy(l.Bias.Value.Float64s(), []float64{0.25, -3})
	b := NewBuilder(nil)
	x := b.Bind("x", tensor.New(tensor.WithShape(2, 3), tensor.WithBacking([]float64{1, 0, -1, 2, 4, 0.5})))
	y, err := l.Forward(b, x)
	if err != nil {
		t.Fatal(err)
	}
	m := G.NewTapeMachine(b.Graph())
	defer m.Close()
	run(t, m)
	// row 0: [1-3+0.25, -1-2-3] ; row 1: [2+8+1.5+0.25, -2+2+1-3]
	want := []float64{-1.75, -6, 11.75, -2}
	got := y.Value().(*tensor.Dense).Float64s()
	for i := range want {
		if math.Abs(got[i]-want[i]) > 1e-15 {
			t.Fatalf("y = %v, want %v", got, want)
		}
	}
	// An in-place update of the weight is seen by the next run.
	l.Weight.Value.Float64s()[0] = 11
	run(t, m)
	if got := y.Value().(*tensor.Dense).Float64s()[0]; math.Abs(got-8.25) > 1e-15 {
		t.Errorf("after updating weight in place y[0,0] = %v, want 8.25", got)
	}
}

func TestLinearGradients(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	for _, bias := range []bool{true, false} {
		l, err := NewLinear(4, 3, WithRand(rng), WithBias(bias), WithDtype(tensor.Float64))
		if err != nil {
			t.Fatal(err)
		}
		x := randParam(rng, "x", 5, 4)
		gradCheck(t, append(l.Params(), x), func(b *Builder) (*G.Node, error) {
			xn, err := b.Node(x)
			if err != nil {
				return nil, err
			}
			y, err := l.Forward(b, xn)
			if err != nil {
				return nil, err
			}
			return weightedSum(b, rng, y)
		})
	}
}

func TestLinear3DInput(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	l, err := NewLinear(4, 2, WithRand(rng), WithDtype(tensor.Float64))
	if err != nil {
		t.Fatal(err)
	}
	x := randParam(rng, "x", 2, 3, 4)
	gradCheck(t, append(l.Params(), x), func(b *Builder) (*G.Node, error) {
		xn, _ := b.Node(x)
		y, err := l.Forward(b, xn)
		if err != nil {
			return nil, err
		}
		if !y.Shape().Eq(tensor.Shape{2, 3, 2}) {
			t.Errorf("output shape %v, want [2 3 2]", y.Shape())
		}
		return weightedSum(b, rng, y)
	})
}

func TestMatMulTAllFlags(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 8))
	for _, ta := range []bool{false, true} {
		for _, tb := range []bool{false, true} {
			as, bs := []int{3, 4}, []int{4, 2}
			if ta {
				as = []int{4, 3}
			}
			if tb {
				bs = []int{2, 4}
			}
			a, bb := randParam(rng, "a", as...), randParam(rng, "b", bs...)
			gradCheck(t, []*Param{a, bb}, func(b *Builder) (*G.Node, error) {
				an, _ := b.Node(a)
				bn, _ := b.Node(bb)
				var tr Transpose
				if ta {
					tr |= TransA
				}
				if tb {
					tr |= TransB
				}
				c, err := MatMulT(an, bn, tr)
				if err != nil {
					return nil, err
				}
				if !c.Shape().Eq(tensor.Shape{3, 2}) {
					t.Errorf("ta=%v tb=%v: shape %v", ta, tb, c.Shape())
				}
				return weightedSum(b, rng, c)
			})
		}
	}
}
