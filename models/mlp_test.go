package models

import (
	"math/rand/v2"
	"reflect"
	"testing"

	G "gorgonia.org/gorgonia"
	"gorgonia.org/tensor"
)

func TestMLPNamesShapesOrder(t *testing.T) {
	m, err := NewMLP([]int{12, 16, 8, 3}, WithActivation(ActTanh), WithRand(rand.New(rand.NewPCG(1, 1))), WithDtype(tensor.Float64))
	if err != nil {
		t.Fatal(err)
	}
	// torch.nn.Sequential(Linear(12,16), Tanh(), Linear(16,8), Tanh(), Linear(8,3)).state_dict()
	want := []struct {
		name  string
		shape tensor.Shape
	}{
		{"0.weight", tensor.Shape{16, 12}}, {"0.bias", tensor.Shape{16}},
		{"2.weight", tensor.Shape{8, 16}}, {"2.bias", tensor.Shape{8}},
		{"4.weight", tensor.Shape{3, 8}}, {"4.bias", tensor.Shape{3}},
	}
	sd := StateDict(m)
	if len(sd) != len(want) || len(m.Params()) != len(want) || len(m.Buffers()) != 0 {
		t.Fatalf("state dict has %d entries, params %d, want %d", len(sd), len(m.Params()), len(want))
	}
	for i, w := range want {
		if sd[i].Name != w.name || !sd[i].Value.Shape().Eq(w.shape) {
			t.Errorf("entry %d: %s %v, want %s %v", i, sd[i].Name, sd[i].Value.Shape(), w.name, w.shape)
		}
	}
	if _, ok := m.Layers[1].(Tanh); !ok || len(m.Layers) != 5 {
		t.Errorf("layers %v", m.Layers)
	}
	nb, err := NewMLP([]int{4, 3}, WithBias(false), WithDtype(tensor.Float32))
	if err != nil {
		t.Fatal(err)
	}
	if got := names(StateDict(nb)); !reflect.DeepEqual(got, []string{"0.weight"}) || nb.Params()[0].Value.Dtype() != tensor.Float32 {
		t.Errorf("no-bias float32 MLP: %v", got)
	}
	if _, err := NewMLP([]int{4}, WithDtype(tensor.Float64)); err == nil {
		t.Error("one-size MLP accepted")
	}
	if _, err := NewMLP([]int{4, 2, 2}, WithActivation("sigmoid"), WithDtype(tensor.Float64)); err == nil {
		t.Error("unknown activation accepted")
	}
}

func names(ps []*Param) []string {
	out := make([]string, len(ps))
	for i, p := range ps {
		out[i] = p.Name
	}
	return out
}

func TestMLPSameSeedSameWeights(t *testing.T) {
	a, _ := NewMLP([]int{5, 4, 2}, WithRand(rand.New(rand.NewPCG(42, 0))), WithDtype(tensor.Float64))
	b, _ := NewMLP([]int{5, 4, 2}, WithRand(rand.New(rand.NewPCG(42, 0))), WithDtype(tensor.Float64))
	c, _ := NewMLP([]int{5, 4, 2}, WithRand(rand.New(rand.NewPCG(43, 0))), WithDtype(tensor.Float64))
	pa, pb, pc := StateDict(a), StateDict(b), StateDict(c)
	for i := range pa {
		if !reflect.DeepEqual(pa[i].Value.Data(), pb[i].Value.Data()) {
			t.Errorf("%s differs between equal seeds", pa[i].Name)
		}
		if reflect.DeepEqual(pa[i].Value.Data(), pc[i].Value.Data()) {
			t.Errorf("%s equal across different seeds", pa[i].Name)
		}
	}
}

func TestMLPTrainingGradients(t *testing.T) {
	rng := rand.New(rand.NewPCG(2, 3))
	for _, act := range []Activation{ActReLU, ActTanh, ActGELU} {
		m, err := NewMLP([]int{5, 6, 4, 3}, WithActivation(act), WithRand(rng), WithDtype(tensor.Float64))
		if err != nil {
			t.Fatal(err)
		}
		x := randParam(rng, "x", 7, 5)
		lab := tensor.New(tensor.WithShape(7), tensor.WithBacking([]int64{0, 1, 2, 2, 1, 0, 1}))
		gradCheck(t, append(m.Params(), x), xentLoss(m, x, lab))
	}
}

// Backward skips parameters that do not influence the loss, and the
// builder reports params and nodes in binding order.
func TestBuilderUnusedParamsAndOrder(t *testing.T) {
	rng := rand.New(rand.NewPCG(2, 3))
	used, _ := NewLinear(3, 2, WithRand(rng), WithDtype(tensor.Float64))
	unused, _ := NewLinear(3, 2, WithRand(rng), WithDtype(tensor.Float64))
	b := NewBuilder(nil)
	x := b.Bind("x", tensor.New(tensor.WithShape(1, 3), tensor.WithBacking([]float64{1, 2, 3})))
	y, err := used.Forward(b, x)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := unused.Forward(b, x); err != nil {
		t.Fatal(err)
	}
	s, _ := G.Sum(y)
	if err := b.Backward(s); err != nil {
		t.Fatal(err)
	}
	if got := len(b.ParamNodes()); got != 4 {
		t.Errorf("%d param nodes, want 4", got)
	}
	if got := b.GradParams(); len(got) != 2 || got[0] != used.Weight || got[1] != used.Bias {
		t.Errorf("grad params %v", names(got))
	}
	if b.GradNode(unused.Weight) != nil {
		t.Error("unused weight has a gradient node")
	}
	if n1, _ := b.Node(used.Weight); n1 != b.ParamNodes()[0] {
		t.Error("Node is not stable for a param")
	}
	vm := G.NewTapeMachine(b.Graph())
	defer vm.Close()
	run(t, vm)
	if err := b.CopyGrads(); err != nil {
		t.Fatal(err)
	}
	if err := b.AccumulateGrads(); err != nil {
		t.Fatal(err)
	}
	// d sum(xWᵀ+b)/dW[o,i] = x[i], accumulated twice
	want := []float64{2, 4, 6, 2, 4, 6}
	if !reflect.DeepEqual(used.Weight.Grad.Float64s(), want) || unused.Weight.Grad != nil {
		t.Errorf("grad %v, want %v", used.Weight.Grad.Float64s(), want)
	}
}
