package models

import (
	"errors"
	"math"
	"math/rand/v2"
	"reflect"
	"testing"

	G "gorgonia.org/gorgonia"
	"gorgonia.org/tensor"

	"github.com/tandemml/tandem/internal/errs"
)

func TestDefaultDtypeIsFloat32(t *testing.T) {
	mlp, err := NewMLP([]int{3, 4, 2})
	if err != nil {
		t.Fatal(err)
	}
	cnn, err := NewCNN(CNNConfig{Size: 8, Channels1: 2, Channels2: 2, Kernel: 3, Hidden: 4, Classes: 2}, nil)
	if err != nil {
		t.Fatal(err)
	}
	bn, _ := NewBatchNorm2d(2)
	emb, _ := NewEmbedding(3, 2)
	for _, m := range []Module{mlp, cnn, bn, emb} {
		for _, p := range StateDict(m) {
			if p.Value.Dtype() != tensor.Float32 && p.Name != "num_batches_tracked" { // int64, as in torch
				t.Errorf("%T %s: dtype %v, want float32 by default", m, p.Name, p.Value.Dtype())
			}
		}
	}
	// float64 is one option away, and the float32 model holds the float64
	// model's values rounded.
	m64, _ := NewMLP([]int{3, 4, 2}, WithDtype(tensor.Float64))
	for i, p := range StateDict(m64) {
		if p.Value.Dtype() != tensor.Float64 {
			t.Fatalf("%s: dtype %v with WithDtype(Float64)", p.Name, p.Value.Dtype())
		}
		f32 := StateDict(mlp)[i].Value.Float32s()
		for j, v := range p.Value.Float64s() {
			if float32(v) != f32[j] {
				t.Fatalf("%s[%d]: float32 %v is not float64 %v rounded", p.Name, j, f32[j], v)
			}
		}
	}
}

func TestNewParamMatchesLayers(t *testing.T) {
	for _, dt := range []tensor.Dtype{tensor.Float32, tensor.Float64} {
		lin, err := NewLinear(5, 3, WithRand(rand.New(rand.NewPCG(4, 4))), WithDtype(dt))
		if err != nil {
			t.Fatal(err)
		}
		rng := rand.New(rand.NewPCG(4, 4))
		w, err := NewParam("weight", []int{3, 5}, dt, FanInUniform(5, rng))
		if err != nil {
			t.Fatal(err)
		}
		b, err := NewParam("bias", []int{3}, dt, FanInUniform(5, rng))
		if err != nil {
			t.Fatal(err)
		}
		for _, pair := range [][2]*Param{{lin.Weight, w}, {lin.Bias, b}} {
			if !reflect.DeepEqual(pair[0].Value.Data(), pair[1].Value.Data()) || pair[0].Name != pair[1].Name || !pair[1].RequiresGrad {
				t.Errorf("%v: NewParam %s differs from NewLinear's", dt, pair[1].Name)
			}
		}
		conv, _ := NewConv2d(2, 3, 3, WithRand(rand.New(rand.NewPCG(6, 6))), WithDtype(dt))
		crng := rand.New(rand.NewPCG(6, 6))
		cw, _ := NewParam("weight", []int{3, 2, 3, 3}, dt, FanInUniform(2*3*3, crng))
		cb, _ := NewParam("bias", []int{3}, dt, FanInUniform(2*3*3, crng))
		if !reflect.DeepEqual(conv.Weight.Value.Data(), cw.Value.Data()) || !reflect.DeepEqual(conv.Bias.Value.Data(), cb.Value.Data()) {
			t.Errorf("%v: FanInUniform differs from NewConv2d's tensors", dt)
		}
		emb, _ := NewEmbedding(4, 2, WithRand(rand.New(rand.NewPCG(8, 1))), WithDtype(dt))
		e, _ := NewParam("weight", []int{4, 2}, dt, Normal(0, 1, rand.New(rand.NewPCG(8, 1))))
		if !reflect.DeepEqual(emb.Weight.Value.Data(), e.Value.Data()) {
			t.Errorf("%v: Normal(0, 1) differs from NewEmbedding's weight", dt)
		}
	}
}

func TestInitializers(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	shape := []int{64, 32, 3, 3} // fan_in 288, fan_out 576
	stats := func(init Init) (lo, hi, mean, std float64) {
		p, err := NewParam("w", shape, tensor.Float64, init)
		if err != nil {
			t.Fatal(err)
		}
		v := p.Value.Float64s()
		lo, hi = math.Inf(1), math.Inf(-1)
		for _, x := range v {
			lo, hi, mean = math.Min(lo, x), math.Max(hi, x), mean+x
		}
		mean /= float64(len(v))
		for _, x := range v {
			std += (x - mean) * (x - mean)
		}
		return lo, hi, mean, math.Sqrt(std / float64(len(v)))
	}
	near := func(name string, got, want, tol float64) {
		if math.Abs(got-want) > tol*math.Abs(want) {
			t.Errorf("%s: %v, want %v within %v%%", name, got, want, 100*tol)
		}
	}
	b := 1 / math.Sqrt(288)
	lo, hi, _, std := stats(KaimingUniform(math.Sqrt(5), rng))
	if lo < -b || hi > b {
		t.Errorf("kaiming_uniform(a=√5) outside ±%v: [%v, %v]", b, lo, hi)
	}
	near("kaiming_uniform(a=√5) std", std, b/math.Sqrt(3), 0.03)
	_, _, _, std = stats(KaimingNormal(0, rng))
	near("kaiming_normal(a=0) std", std, math.Sqrt(2.0/288), 0.03)
	bx := math.Sqrt(6.0 / (288 + 576))
	lo, hi, _, _ = stats(XavierUniform(1, rng))
	if lo < -bx || hi > bx || hi < 0.9*bx {
		t.Errorf("xavier_uniform outside ±%v or not spanning it: [%v, %v]", bx, lo, hi)
	}
	_, _, _, std = stats(XavierNormal(2, rng))
	near("xavier_normal(gain=2) std", std, 2*math.Sqrt(2.0/(288+576)), 0.03)
	_, _, mean, std := stats(Normal(3, 0.5, rng))
	near("normal mean", mean, 3, 0.01)
	near("normal std", std, 0.5, 0.03)
	lo, hi, _, _ = stats(Uniform(-2, 5, rng))
	if lo < -2 || hi > 5 || lo > -1.9 || hi < 4.9 {
		t.Errorf("uniform(-2, 5) range [%v, %v]", lo, hi)
	}
	for init, want := range map[string]float64{"zeros": 0, "ones": 1, "constant": 0.25} {
		f := map[string]Init{"zeros": Zeros(), "ones": Ones(), "constant": Constant(0.25)}[init]
		p, _ := NewBuffer("b", []int{3}, tensor.Float32, f)
		if got := p.Value.Float32s(); got[0] != float32(want) || got[2] != float32(want) || p.RequiresGrad {
			t.Errorf("%s buffer: %v requiresGrad %v", init, got, p.RequiresGrad)
		}
	}
	// the same seed gives the same values
	a, _ := NewParam("w", []int{2, 3}, tensor.Float32, Normal(0, 1, rand.New(rand.NewPCG(5, 5))))
	c, _ := NewParam("w", []int{2, 3}, tensor.Float32, Normal(0, 1, rand.New(rand.NewPCG(5, 5))))
	if !reflect.DeepEqual(a.Value.Data(), c.Value.Data()) {
		t.Error("a seeded Normal is not reproducible")
	}
}

func TestNewParamErrors(t *testing.T) {
	cases := []struct {
		name  string
		shape []int
		dt    tensor.Dtype
		init  Init
	}{
		{"", []int{2}, tensor.Float32, nil},
		{"a.b", []int{2}, tensor.Float32, nil},
		{"w", nil, tensor.Float32, nil},
		{"w", []int{2, 0}, tensor.Float32, nil},
		{"w", []int{2}, tensor.Int64, nil},
		{"w", []int{2}, tensor.Float32, KaimingUniform(0, nil)}, // fan-in needs 2 dimensions
		{"w", []int{2}, tensor.Float32, Uniform(1, 0, nil)},
		{"w", []int{2}, tensor.Float32, Normal(0, -1, nil)},
		{"w", []int{2}, tensor.Float32, FanInUniform(0, nil)},
	}
	for _, c := range cases {
		if _, err := NewParam(c.name, c.shape, c.dt, c.init); !errors.Is(err, errs.InvalidArgument) {
			t.Errorf("NewParam(%q, %v, %v): %v, want InvalidArgument", c.name, c.shape, c.dt, err)
		}
	}
}

// tower is a user-written module: its own scale, then two named children.
type tower struct {
	Container
	scale, count *Param
	enc, head    *Linear
}

// Forward is head(enc(x)); the test reads names only.
func (m *tower) Forward(b *Builder, x *G.Node) (*G.Node, error) {
	h, err := m.enc.Forward(b, x)
	if err != nil {
		return nil, err
	}
	return m.head.Forward(b, h)
}

type outer struct{ Container }

func (o *outer) Forward(b *Builder, x *G.Node) (*G.Node, error) { return x, nil }

func newTower(t *testing.T, rng *rand.Rand) *tower {
	m := &tower{}
	var err error
	if m.scale, err = NewParam("scale", []int{1}, tensor.Float64, Ones()); err != nil {
		t.Fatal(err)
	}
	if m.count, err = NewBuffer("count", []int{1}, tensor.Float64, Zeros()); err != nil {
		t.Fatal(err)
	}
	m.enc, _ = NewLinear(4, 3, WithRand(rng), WithDtype(tensor.Float64))
	m.head, _ = NewLinear(3, 2, WithRand(rng), WithDtype(tensor.Float64))
	for _, err := range []error{m.AddParam(m.scale), m.AddBuffer(m.count), m.AddChild("enc", m.enc), m.AddChild("head", m.head)} {
		if err != nil {
			t.Fatal(err)
		}
	}
	return m
}

func TestContainerNames(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 3))
	inner := newTower(t, rng)
	bn, _ := NewBatchNorm2d(2)
	outer := &outer{}
	if err := outer.AddChild("tower", inner); err != nil {
		t.Fatal(err)
	}
	if err := outer.AddChild("bn", bn); err != nil {
		t.Fatal(err)
	}
	seq := NewSequential(outer)
	// torch: Sequential(Outer(tower=Tower(...), bn=BatchNorm2d(2))).state_dict()
	want := []string{"0.tower.scale", "0.tower.count", "0.tower.enc.weight", "0.tower.enc.bias", "0.tower.head.weight", "0.tower.head.bias",
		"0.bn.weight", "0.bn.bias", "0.bn.running_mean", "0.bn.running_var", "0.bn.num_batches_tracked"}
	if got := names(StateDict(seq)); !reflect.DeepEqual(got, want) {
		t.Errorf("state_dict names %v\nwant %v", got, want)
	}
	wantP := []string{"0.tower.scale", "0.tower.enc.weight", "0.tower.enc.bias", "0.tower.head.weight", "0.tower.head.bias", "0.bn.weight", "0.bn.bias"}
	if got := names(seq.Params()); !reflect.DeepEqual(got, wantP) {
		t.Errorf("parameter names %v\nwant %v", got, wantP)
	}
	if got := names(seq.Buffers()); !reflect.DeepEqual(got, []string{"0.tower.count", "0.bn.running_mean", "0.bn.running_var", "0.bn.num_batches_tracked"}) {
		t.Errorf("buffer names %v", got)
	}
	if ch := inner.Children(); len(ch) != 2 || ch[0].Name != "enc" || ch[1].Module != Module(inner.head) {
		t.Errorf("children %v", ch)
	}
	other, _ := NewLinear(2, 2)
	for name, err := range map[string]error{
		"repeated child":         inner.AddChild("enc", other),
		"child named as a param": inner.AddChild("scale", other),
		"dotted child":           inner.AddChild("a.b", other),
		"nil child":              inner.AddChild("x", nil),
		"nil param":              inner.AddParam(nil),
		"NameChild empty":        NameChild("", other),
	} {
		if !errors.Is(err, errs.InvalidArgument) {
			t.Errorf("%s: %v, want InvalidArgument", name, err)
		}
	}
	if other.Weight.Name != "weight" {
		t.Errorf("a refused child was renamed to %q", other.Weight.Name)
	}
}
