package models

import (
	"math"
	"math/rand/v2"
	"testing"

	G "gorgonia.org/gorgonia"
	"gorgonia.org/tensor"
)

func TestCrossEntropyByHand(t *testing.T) {
	// logits [[1,2,3],[1000,0,-1000]], labels [2, 1]:
	// row 0: lse = 3 + log(1+e^-1+e^-2), loss = lse-3
	// row 1: lse = 1000 (+ tiny), loss = 1000 - 0 = 1000 (stable log-sum-exp)
	z := []float64{1, 2, 3, 1000, 0, -1000}
	l0 := math.Log(1 + math.Exp(-1) + math.Exp(-2))
	want := (l0 + 1000) / 2
	for _, labelDtype := range []tensor.Dtype{tensor.Int64, tensor.Int, tensor.Int32} {
		var lab *tensor.Dense
		switch labelDtype {
		case tensor.Int64:
			lab = tensor.New(tensor.WithShape(2), tensor.WithBacking([]int64{2, 1}))
		case tensor.Int:
			lab = tensor.New(tensor.WithShape(2), tensor.WithBacking([]int{2, 1}))
		default:
			lab = tensor.New(tensor.WithShape(2), tensor.WithBacking([]int32{2, 1}))
		}
		b := NewBuilder(nil)
		loss, err := CrossEntropy(b.Bind("z", tensor.New(tensor.WithShape(2, 3), tensor.WithBacking(append([]float64(nil), z...)))), b.Bind("y", lab))
		if err != nil {
			t.Fatal(err)
		}
		vm := G.NewTapeMachine(b.Graph())
		run(t, vm)
		vm.Close()
		if got := scalar(t, loss); math.Abs(got-want) > 1e-12 {
			t.Errorf("%v labels: loss %v, want %v", labelDtype, got, want)
		}
	}
	// one-hot probabilities give the same loss
	b := NewBuilder(nil)
	oh := tensor.New(tensor.WithShape(2, 3), tensor.WithBacking([]float64{0, 0, 1, 0, 1, 0}))
	loss, err := CrossEntropy(b.Bind("z", tensor.New(tensor.WithShape(2, 3), tensor.WithBacking(z))), b.Bind("y", oh))
	if err != nil {
		t.Fatal(err)
	}
	vm := G.NewTapeMachine(b.Graph())
	defer vm.Close()
	run(t, vm)
	if got := scalar(t, loss); math.Abs(got-want) > 1e-12 {
		t.Errorf("one-hot: loss %v, want %v", got, want)
	}
}

func TestCrossEntropyGradients(t *testing.T) {
	rng := rand.New(rand.NewPCG(11, 12))
	z := randParam(rng, "z", 4, 5)
	lab := tensor.New(tensor.WithShape(4), tensor.WithBacking([]int64{0, 4, 2, 2}))
	gradCheck(t, []*Param{z}, func(b *Builder) (*G.Node, error) {
		zn, _ := b.Node(z)
		return CrossEntropy(zn, b.Bind("y", lab))
	})
	// soft targets (rows not summing to one, to check the general formula)
	probs := newParam("t", tensor.Float64, false, []int{4, 5}, func(int) float64 { return rng.Float64() })
	gradCheck(t, []*Param{z}, func(b *Builder) (*G.Node, error) {
		zn, _ := b.Node(z)
		return CrossEntropy(zn, b.Bind("t", probs.Value))
	})
	// scaled upstream gradient: loss·3
	gradCheck(t, []*Param{z}, func(b *Builder) (*G.Node, error) {
		zn, _ := b.Node(z)
		l, err := CrossEntropy(zn, b.Bind("y", lab))
		if err != nil {
			return nil, err
		}
		return G.Mul(l, G.NewConstant(3.0))
	})
}

func TestCrossEntropyErrors(t *testing.T) {
	b := NewBuilder(nil)
	z := b.Bind("z", tensor.New(tensor.WithShape(2, 3), tensor.WithBacking(make([]float64, 6))))
	if _, err := CrossEntropy(z, b.Bind("y", tensor.New(tensor.WithShape(3), tensor.WithBacking([]int64{0, 1, 2})))); err == nil {
		t.Error("label count mismatch accepted")
	}
	if _, err := CrossEntropy(z, b.Bind("y", tensor.New(tensor.WithShape(2), tensor.WithBacking([]float64{0, 1})))); err == nil {
		t.Error("float labels accepted")
	}
	loss, err := CrossEntropy(z, b.Bind("y", tensor.New(tensor.WithShape(2), tensor.WithBacking([]int64{0, 3}))))
	if err != nil {
		t.Fatal(err)
	}
	_ = loss
	vm := G.NewTapeMachine(b.Graph())
	defer vm.Close()
	if err := vm.RunAll(); err == nil {
		t.Error("label 3 of 3 classes accepted at run time")
	}
}

func TestMSE(t *testing.T) {
	rng := rand.New(rand.NewPCG(13, 14))
	p := randParam(rng, "p", 3, 2)
	y := randParam(rng, "y", 3, 2)
	gradCheck(t, []*Param{p}, func(b *Builder) (*G.Node, error) {
		pn, _ := b.Node(p)
		return MSE(pn, b.Bind("y", y.Value))
	})
	b := NewBuilder(nil)
	l, err := MSE(b.Bind("p", tensor.New(tensor.WithShape(2), tensor.WithBacking([]float64{1, 2}))),
		b.Bind("y", tensor.New(tensor.WithShape(2), tensor.WithBacking([]float64{0, 5}))))
	if err != nil {
		t.Fatal(err)
	}
	vm := G.NewTapeMachine(b.Graph())
	defer vm.Close()
	run(t, vm)
	if got := scalar(t, l); got != 5 {
		t.Errorf("MSE = %v, want (1+9)/2 = 5", got)
	}
}
