package models

import (
	"math"
	"math/rand/v2"
	"reflect"
	"testing"

	G "gorgonia.org/gorgonia"
	"gorgonia.org/tensor"
)

func TestLayerNormByHandAndGradients(t *testing.T) {
	l, err := NewLayerNorm([]int{4}, WithDtype(tensor.Float64))
	if err != nil {
		t.Fatal(err)
	}
	x := []float64{1, 2, 3, 4, -1, 0, 0, 5}
	got := forward1(t, l, tensor.New(tensor.WithShape(2, 4), tensor.WithBacking(x)))
	for r := 0; r < 2; r++ {
		row := x[r*4 : r*4+4]
		m := (row[0] + row[1] + row[2] + row[3]) / 4
		var v float64
		for _, e := range row {
			v += (e - m) * (e - m)
		}
		v /= 4
		for i, e := range row {
			if want := (e - m) / math.Sqrt(v+1e-5); math.Abs(got[r*4+i]-want) > 1e-14 {
				t.Fatalf("row %d: %v, want %v", r, got[r*4+i], want)
			}
		}
	}
	if names(l.Params())[0] != "weight" || !l.Weight.Value.Shape().Eq(tensor.Shape{4}) {
		t.Errorf("params %v", names(l.Params()))
	}
	rng := rand.New(rand.NewPCG(31, 32))
	l2, _ := NewLayerNorm([]int{3, 2}, WithEps(1e-3), WithDtype(tensor.Float64))
	for _, p := range l2.Params() { // non-trivial affine
		for i := range p.Value.Float64s() {
			p.Value.Float64s()[i] = rng.NormFloat64()
		}
	}
	xp := randParam(rng, "x", 2, 2, 3, 2)
	gradCheck(t, append(l2.Params(), xp), func(b *Builder) (*G.Node, error) {
		xn, _ := b.Node(xp)
		y, err := l2.Forward(b, xn)
		if err != nil {
			return nil, err
		}
		return weightedSum(b, rng, y)
	})
	noAff, _ := NewLayerNorm([]int{2}, WithAffine(false), WithDtype(tensor.Float64))
	if len(noAff.Params()) != 0 {
		t.Error("LayerNorm without affine has params")
	}
}

func TestBatchNorm2dStateDict(t *testing.T) {
	bn, err := NewBatchNorm2d(3, WithDtype(tensor.Float64))
	if err != nil {
		t.Fatal(err)
	}
	seq := NewSequential(bn)
	want := []string{"0.weight", "0.bias", "0.running_mean", "0.running_var", "0.num_batches_tracked"}
	if got := names(StateDict(seq)); !reflect.DeepEqual(got, want) {
		t.Errorf("state dict %v, want %v", got, want)
	}
	if nb := bn.NumBatchesTracked.Value; nb.Dtype() != tensor.Int64 || !nb.IsScalar() {
		t.Errorf("num_batches_tracked %v %v", nb.Dtype(), nb.Shape())
	}
	if !reflect.DeepEqual(bn.RunningVar.Value.Float64s(), []float64{1, 1, 1}) || bn.RunningVar.RequiresGrad {
		t.Error("running_var init")
	}
}

func TestBatchNorm2dTrainEval(t *testing.T) {
	rng := rand.New(rand.NewPCG(33, 34))
	bn, _ := NewBatchNorm2d(2, WithMomentum(0.3), WithDtype(tensor.Float64))
	copy(bn.Weight.Value.Float64s(), []float64{2, -1})
	copy(bn.Bias.Value.Float64s(), []float64{0.5, 3})
	const n, h, w = 3, 2, 2
	x := randParam(rng, "x", n, 2, h, w)
	xd := x.Value.Float64s()
	// by hand: per channel statistics over n·h·w
	var mean, biased [2]float64
	for c := 0; c < 2; c++ {
		var vals []float64
		for b := 0; b < n; b++ {
			vals = append(vals, xd[(b*2+c)*h*w:(b*2+c+1)*h*w]...)
		}
		for _, v := range vals {
			mean[c] += v
		}
		mean[c] /= float64(len(vals))
		for _, v := range vals {
			biased[c] += (v - mean[c]) * (v - mean[c])
		}
		biased[c] /= float64(len(vals))
	}
	got := forward1(t, bn, x.Value)
	for i, v := range xd {
		c := (i / (h * w)) % 2
		want := (v-mean[c])/math.Sqrt(biased[c]+1e-5)*bn.Weight.Value.Float64s()[c] + bn.Bias.Value.Float64s()[c]
		if math.Abs(got[i]-want) > 1e-13 {
			t.Fatalf("train out[%d] = %v, want %v", i, got[i], want)
		}
	}
	m := float64(n * h * w)
	for c := 0; c < 2; c++ {
		wantM := 0.3 * mean[c]
		wantV := 0.7*1 + 0.3*biased[c]*m/(m-1)
		if rm := bn.RunningMean.Value.Float64s()[c]; math.Abs(rm-wantM) > 1e-15 {
			t.Errorf("running_mean[%d] = %v, want %v", c, rm, wantM)
		}
		if rv := bn.RunningVar.Value.Float64s()[c]; math.Abs(rv-wantV) > 1e-15 {
			t.Errorf("running_var[%d] = %v, want %v", c, rv, wantV)
		}
	}
	if k := bn.NumBatchesTracked.Value.Data().(int64); k != 1 {
		t.Errorf("num_batches_tracked = %d, want 1", k)
	}
	// eval: running statistics, no updates
	rm := append([]float64(nil), bn.RunningMean.Value.Float64s()...)
	rv := append([]float64(nil), bn.RunningVar.Value.Float64s()...)
	got = forward1(t, bn, x.Value, WithMode(Eval))
	for i, v := range xd {
		c := (i / (h * w)) % 2
		want := (v-rm[c])/math.Sqrt(rv[c]+1e-5)*bn.Weight.Value.Float64s()[c] + bn.Bias.Value.Float64s()[c]
		if math.Abs(got[i]-want) > 1e-13 {
			t.Fatalf("eval out[%d] = %v, want %v", i, got[i], want)
		}
	}
	if k := bn.NumBatchesTracked.Value.Data().(int64); k != 1 || !reflect.DeepEqual(rm, bn.RunningMean.Value.Float64s()) {
		t.Error("eval mode changed the running statistics")
	}
	// gradients, both modes
	for _, mode := range []Mode{Train, Eval} {
		gradCheck(t, append(bn.Params(), x), func(b *Builder) (*G.Node, error) {
			xn, _ := b.Node(x)
			y, err := bn.Forward(b, xn)
			if err != nil {
				return nil, err
			}
			return weightedSum(b, rng, y)
		}, WithMode(mode))
	}
	one := randParam(rng, "x", 1, 2, 1, 1)
	b := NewBuilder(nil)
	if _, err := bn.Forward(b, b.Bind("x", one.Value)); err != nil {
		t.Fatal(err)
	}
	vm := G.NewTapeMachine(b.Graph())
	defer vm.Close()
	if err := vm.RunAll(); err == nil {
		t.Error("training on one value per channel accepted")
	}
}

func TestDropout(t *testing.T) {
	if _, err := NewDropout(1.5); err == nil {
		t.Error("p=1.5 accepted")
	}
	d, _ := NewDropout(0.25)
	x := &Param{Name: "x", Value: newParam("x", tensor.Float64, true, []int{100, 40}, func(i int) float64 { return float64(i%7) + 1 }).Value, RequiresGrad: true}
	// eval: identity, and no extra nodes
	b := NewBuilder(nil, WithMode(Eval))
	xn, _ := b.Node(x)
	if y, _ := d.Forward(b, xn); y != xn {
		t.Error("eval-mode dropout is not the identity")
	}
	// train
	b = NewBuilder(nil, WithBuilderRand(rand.New(rand.NewPCG(1, 1))))
	xn, _ = b.Node(x)
	y, err := d.Forward(b, xn)
	if err != nil {
		t.Fatal(err)
	}
	y2, _ := d.Forward(b, xn) // a second, independent mask on the same input
	vm := backwardSum(t, b, y)
	out := y.Value().(*tensor.Dense).Float64s()
	out2 := y2.Value().(*tensor.Dense).Float64s()
	xs, gs := x.Value.Float64s(), x.Grad.Float64s()
	zeros, same := 0, 0
	for i, v := range out {
		switch {
		case v == 0:
			zeros++
			if gs[i] != 0 {
				t.Fatalf("dropped element %d has gradient %v", i, gs[i])
			}
		case math.Abs(v-xs[i]/0.75) < 1e-12:
			if math.Abs(gs[i]-1/0.75) > 1e-12 {
				t.Fatalf("kept element %d has gradient %v, want 1/0.75", i, gs[i])
			}
		default:
			t.Fatalf("element %d: %v from %v", i, v, xs[i])
		}
		if (v == 0) == (out2[i] == 0) {
			same++
		}
	}
	if frac := float64(zeros) / float64(len(out)); math.Abs(frac-0.25) > 0.03 {
		t.Errorf("dropped fraction %v, want about 0.25", frac)
	}
	if same == len(out) {
		t.Error("two dropout layers drew the same mask")
	}
	first := append([]float64(nil), out...)
	run(t, vm)
	if reflect.DeepEqual(first, y.Value().(*tensor.Dense).Float64s()) {
		t.Error("a second run reused the mask")
	}
}

func TestEmbedding(t *testing.T) {
	rng := rand.New(rand.NewPCG(41, 42))
	e, err := NewEmbedding(5, 3, WithRand(rng), WithDtype(tensor.Float64))
	if err != nil {
		t.Fatal(err)
	}
	if !e.Weight.Value.Shape().Eq(tensor.Shape{5, 3}) {
		t.Errorf("weight shape %v", e.Weight.Value.Shape())
	}
	idx := tensor.New(tensor.WithShape(2, 3), tensor.WithBacking([]int64{4, 0, 4, 1, 1, 2}))
	got := forward1(t, e, idx)
	w := e.Weight.Value.Float64s()
	for i, k := range idx.Data().([]int64) {
		for j := 0; j < 3; j++ {
			if got[i*3+j] != w[int(k)*3+j] {
				t.Fatalf("row %d: %v, want row %d of the table", i, got[i*3:i*3+3], k)
			}
		}
	}
	gradCheck(t, e.Params(), func(b *Builder) (*G.Node, error) {
		y, err := e.Forward(b, b.Bind("idx", idx))
		if err != nil {
			return nil, err
		}
		if !y.Shape().Eq(tensor.Shape{2, 3, 3}) {
			t.Errorf("output shape %v", y.Shape())
		}
		return weightedSum(b, rng, y)
	})
	b := NewBuilder(nil)
	if _, err := e.Forward(b, b.Bind("idx", tensor.New(tensor.WithShape(1), tensor.WithBacking([]int64{5})))); err != nil {
		t.Fatal(err)
	}
	vm := G.NewTapeMachine(b.Graph())
	defer vm.Close()
	if err := vm.RunAll(); err == nil {
		t.Error("index 5 of 5 rows accepted")
	}
	// N(0,1) init
	big, _ := NewEmbedding(200, 50, WithRand(rng), WithDtype(tensor.Float64))
	var s, ss float64
	for _, v := range big.Weight.Value.Float64s() {
		s += v
		ss += v * v
	}
	if m, v := s/1e4, ss/1e4; math.Abs(m) > 0.05 || math.Abs(v-1) > 0.05 {
		t.Errorf("embedding init mean %v variance %v, want 0 and 1", m, v)
	}
}
