package models

import (
	"math"
	"math/rand/v2"
	"testing"

	G "gorgonia.org/gorgonia"
	"gorgonia.org/tensor"
)

func forward1(t *testing.T, m Module, x *tensor.Dense, opts ...BuilderOption) []float64 {
	t.Helper()
	b := NewBuilder(nil, opts...)
	y, err := m.Forward(b, b.Bind("x", x))
	if err != nil {
		t.Fatal(err)
	}
	vm := G.NewTapeMachine(b.Graph())
	defer vm.Close()
	run(t, vm)
	d, err := denseOf(y.Value())
	if err != nil {
		t.Fatal(err)
	}
	return d.Float64s()
}

func TestActivationsByHand(t *testing.T) {
	in := []float64{-2, -0.5, 0, 0.5, 3}
	x := tensor.New(tensor.WithShape(5), tensor.WithBacking(in))
	phi := func(v float64) float64 { return 0.5 * (1 + math.Erf(v/math.Sqrt2)) }
	cases := []struct {
		m Module
		f func(float64) float64
	}{
		{ReLU{}, func(v float64) float64 { return math.Max(v, 0) }},
		{Tanh{}, math.Tanh},
		{GELU{}, func(v float64) float64 { return v * phi(v) }},
	}
	for _, c := range cases {
		got := forward1(t, c.m, x)
		for i, v := range in {
			if math.Abs(got[i]-c.f(v)) > 1e-15 {
				t.Errorf("%T(%v) = %v, want %v", c.m, v, got[i], c.f(v))
			}
		}
	}
	// GELU(1) = Φ(1) ≈ 0.8413447460685429 (table value)
	g := forward1(t, GELU{}, tensor.New(tensor.WithShape(1), tensor.WithBacking([]float64{1})))
	if math.Abs(g[0]-0.8413447460685429) > 1e-15 {
		t.Errorf("GELU(1) = %v", g[0])
	}
}

func TestActivationGradients(t *testing.T) {
	rng := rand.New(rand.NewPCG(9, 10))
	for _, m := range []Module{ReLU{}, Tanh{}, GELU{}} {
		x := randParam(rng, "x", 3, 4)
		gradCheck(t, []*Param{x}, func(b *Builder) (*G.Node, error) {
			xn, _ := b.Node(x)
			y, err := m.Forward(b, xn)
			if err != nil {
				return nil, err
			}
			return weightedSum(b, rng, y)
		})
	}
}

// ReLU's derivative at exactly 0 is 0, as in PyTorch.
func TestReLUGradientAtZero(t *testing.T) {
	x := &Param{Name: "x", Value: tensor.New(tensor.WithShape(3), tensor.WithBacking([]float64{-1, 0, 2})), RequiresGrad: true}
	b := NewBuilder(nil)
	xn, _ := b.Node(x)
	y, _ := ReLU{}.Forward(b, xn)
	backwardSum(t, b, y)
	want := []float64{0, 0, 1}
	for i, g := range x.Grad.Float64s() {
		if g != want[i] {
			t.Fatalf("relu grad %v, want %v", x.Grad.Float64s(), want)
		}
	}
}

func TestNewActivation(t *testing.T) {
	for _, n := range []Activation{ActReLU, ActTanh, ActGELU} {
		if _, err := NewActivation(n); err != nil {
			t.Errorf("%s: %v", n, err)
		}
	}
	if _, err := NewActivation("swish"); err == nil {
		t.Error("unknown activation accepted")
	}
}
