package models

import (
	"math"
	"math/rand/v2"
	"reflect"
	"testing"

	G "gorgonia.org/gorgonia"
	"gorgonia.org/tensor"
)

func TestCNNNamesShapes(t *testing.T) {
	m, err := NewCNN(CNNConfig{}, rand.New(rand.NewPCG(1, 2)), WithDtype(tensor.Float64))
	if err != nil {
		t.Fatal(err)
	}
	want := []struct {
		name  string
		shape tensor.Shape
	}{
		{"0.weight", tensor.Shape{16, 1, 5, 5}}, {"0.bias", tensor.Shape{16}},
		{"3.weight", tensor.Shape{32, 16, 5, 5}}, {"3.bias", tensor.Shape{32}},
		{"7.weight", tensor.Shape{128, 1568}}, {"7.bias", tensor.Shape{128}},
		{"9.weight", tensor.Shape{10, 128}}, {"9.bias", tensor.Shape{10}},
	}
	sd := StateDict(m)
	if len(sd) != len(want) {
		t.Fatalf("state dict %v", names(sd))
	}
	for i, w := range want {
		if sd[i].Name != w.name || !sd[i].Value.Shape().Eq(w.shape) {
			t.Errorf("entry %d: %s %v, want %s %v", i, sd[i].Name, sd[i].Value.Shape(), w.name, w.shape)
		}
	}
	b := NewBuilder(nil)
	x := b.Bind("x", newDense(tensor.Float64, 2, 1, 28, 28))
	y, err := m.Forward(b, x)
	if err != nil {
		t.Fatal(err)
	}
	if !y.Shape().Eq(tensor.Shape{2, 10}) {
		t.Errorf("logits shape %v", y.Shape())
	}
	if _, err := NewCNN(CNNConfig{Size: 30}, nil, WithDtype(tensor.Float64)); err == nil {
		t.Error("size 30 accepted")
	}
}

func TestCNNGradients(t *testing.T) {
	rng := rand.New(rand.NewPCG(51, 52))
	m, err := NewCNN(CNNConfig{InChannels: 2, Size: 8, Channels1: 2, Channels2: 3, Kernel: 3, Hidden: 5, Classes: 3}, rng, WithDtype(tensor.Float64))
	if err != nil {
		t.Fatal(err)
	}
	x := randParam(rng, "x", 2, 2, 8, 8)
	lab := tensor.New(tensor.WithShape(2), tensor.WithBacking([]int64{2, 0}))
	gradCheck(t, append(m.Params(), x), xentLoss(m, x, lab))
}

func TestNamedSequential(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 1))
	conv, _ := NewConv2d(1, 2, 3, WithRand(rng), WithDtype(tensor.Float64))
	bn, _ := NewBatchNorm2d(2, WithDtype(tensor.Float64))
	fc, _ := NewLinear(2*4*4, 3, WithRand(rng), WithDtype(tensor.Float64))
	s, err := NewNamedSequential(Child{"conv1", conv}, Child{"bn1", bn}, Child{"act", ReLU{}}, Child{"flat", Flatten{}}, Child{"fc", fc})
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"conv1.weight", "conv1.bias", "bn1.weight", "bn1.bias", "bn1.running_mean", "bn1.running_var", "bn1.num_batches_tracked", "fc.weight", "fc.bias"}
	if got := names(StateDict(s)); !reflect.DeepEqual(got, want) {
		t.Errorf("state dict %v, want %v", got, want)
	}
	if got := names(s.Params()); !reflect.DeepEqual(got, []string{"conv1.weight", "conv1.bias", "bn1.weight", "bn1.bias", "fc.weight", "fc.bias"}) {
		t.Errorf("params %v", got)
	}
	if got := names(s.Buffers()); !reflect.DeepEqual(got, []string{"bn1.running_mean", "bn1.running_var", "bn1.num_batches_tracked"}) {
		t.Errorf("buffers %v", got)
	}
	if _, err := NewNamedSequential(Child{"a.b", ReLU{}}); err == nil {
		t.Error("dotted name accepted")
	}
	if _, err := NewNamedSequential(Child{"a", ReLU{}}, Child{"a", Tanh{}}); err == nil {
		t.Error("repeated name accepted")
	}
	// nested containers prefix twice: "block.0.weight"
	inner := NewSequential(func() Module { l, _ := NewLinear(2, 2, WithDtype(tensor.Float64)); return l }())
	outer, _ := NewNamedSequential(Child{"block", inner})
	if got := names(StateDict(outer)); !reflect.DeepEqual(got, []string{"block.0.weight", "block.0.bias"}) {
		t.Errorf("nested names %v", got)
	}
}

// A float32 model computes what the same float64 model computes, to float32
// precision, forward and backward.
func TestFloat32MatchesFloat64(t *testing.T) {
	cfg := CNNConfig{Size: 8, Channels1: 3, Channels2: 4, Kernel: 3, Hidden: 6, Classes: 4}
	m64, _ := NewCNN(cfg, rand.New(rand.NewPCG(9, 9)), WithDtype(tensor.Float64))
	m32, _ := NewCNN(cfg, rand.New(rand.NewPCG(9, 9)), WithDtype(tensor.Float32))
	rng := rand.New(rand.NewPCG(3, 3))
	x64 := newParam("x", tensor.Float64, false, []int{3, 1, 8, 8}, func(int) float64 { return rng.NormFloat64() }).Value
	x32 := newDense(tensor.Float32, 3, 1, 8, 8)
	for i, v := range x64.Float64s() {
		x32.Float32s()[i] = float32(v)
	}
	lab := tensor.New(tensor.WithShape(3), tensor.WithBacking([]int64{1, 3, 0}))
	losses := map[tensor.Dtype]float64{}
	for _, c := range []struct {
		m *Sequential
		x *tensor.Dense
	}{{m64, x64}, {m32, x32}} {
		b, loss := trainGraph(t, c.m, c.x, lab)
		vm := G.NewTapeMachine(b.Graph())
		run(t, vm)
		vm.Close()
		if err := b.CopyGrads(); err != nil {
			t.Fatal(err)
		}
		l, _ := scalarOf(loss.Value())
		losses[c.x.Dtype()] = l
	}
	if d := math.Abs(losses[tensor.Float32] - losses[tensor.Float64]); d > 1e-5 {
		t.Errorf("loss float32 %v, float64 %v", losses[tensor.Float32], losses[tensor.Float64])
	}
	for i, p := range m64.Params() {
		g32 := m32.Params()[i].Grad.Float32s()
		for j, g := range p.Grad.Float64s() {
			if math.Abs(float64(g32[j])-g) > 1e-5 {
				t.Fatalf("%s[%d]: float32 grad %v, float64 %v", p.Name, j, g32[j], g)
			}
		}
	}
}
