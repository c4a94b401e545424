package models

import (
	"math"
	"math/rand/v2"
	"testing"

	G "gorgonia.org/gorgonia"
	"gorgonia.org/tensor"
)

// run executes g once on a fresh tape machine bound to nothing else.
func run(t *testing.T, m G.VM) {
	t.Helper()
	m.Reset()
	if err := m.RunAll(); err != nil {
		t.Fatalf("run: %v", err)
	}
}

// backwardSum backpropagates the sum of y through b's graph, runs the graph
// once under a TapeMachine and copies the gradients into the params. The
// machine, closed when the test ends, is returned to run again.
func backwardSum(t *testing.T, b *Builder, y *G.Node) G.VM {
	t.Helper()
	s, err := G.Sum(y)
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Backward(s); err != nil {
		t.Fatal(err)
	}
	vm := G.NewTapeMachine(b.Graph())
	t.Cleanup(func() { vm.Close() })
	run(t, vm)
	if err := b.CopyGrads(); err != nil {
		t.Fatal(err)
	}
	return vm
}

// xentLoss returns a gradCheck loss: the cross entropy of m's output on x
// against the class labels lab.
func xentLoss(m Module, x *Param, lab *tensor.Dense) func(b *Builder) (*G.Node, error) {
	return func(b *Builder) (*G.Node, error) {
		xn, _ := b.Node(x)
		y, err := m.Forward(b, xn)
		if err != nil {
			return nil, err
		}
		return CrossEntropy(y, b.Bind("y", lab))
	}
}

func scalar(t *testing.T, n *G.Node) float64 {
	t.Helper()
	v, err := scalarOf(n.Value())
	if err != nil {
		t.Fatalf("loss value: %v", err)
	}
	return v
}

// randParam returns a float64 tensor parameter filled from rng.
func randParam(rng *rand.Rand, name string, shape ...int) *Param {
	return newParam(name, tensor.Float64, true, shape, func(int) float64 { return rng.NormFloat64() })
}

// gradCheck builds loss = build(b) (which must use b.Node on every tensor in
// wrt), takes analytic gradients with Builder.Backward and compares them with
// central finite differences of the same graph, rerun after perturbing each
// element in place.
func gradCheck(t *testing.T, wrt []*Param, build func(b *Builder) (*G.Node, error), opts ...BuilderOption) {
	t.Helper()
	b := NewBuilder(nil, opts...)
	loss, err := build(b)
	if err != nil {
		t.Fatalf("build: %v", err)
	}
	if err := b.Backward(loss); err != nil {
		t.Fatalf("backward: %v", err)
	}
	m := G.NewTapeMachine(b.Graph())
	defer m.Close()
	run(t, m)
	if err := b.CopyGrads(); err != nil {
		t.Fatalf("copy grads: %v", err)
	}
	const h = 1e-6
	for _, p := range wrt {
		if p.Grad == nil {
			t.Fatalf("%s: no gradient", p.Name)
		}
		vals := p.Value.Float64s()
		grad := p.Grad.Float64s()
		for i := range vals {
			orig := vals[i]
			vals[i] = orig + h
			run(t, m)
			up := scalar(t, loss)
			vals[i] = orig - h
			run(t, m)
			down := scalar(t, loss)
			vals[i] = orig
			fd := (up - down) / (2 * h)
			if d := math.Abs(fd - grad[i]); d > 1e-6*math.Max(1, math.Abs(fd)) {
				t.Errorf("%s[%d]: analytic %.10g, finite difference %.10g", p.Name, i, grad[i], fd)
			}
		}
	}
}

// weightedSum returns Σ x ⊙ w for a fixed random w, a loss whose gradient
// with respect to x is w (so every output element is checked).
func weightedSum(b *Builder, rng *rand.Rand, x *G.Node) (*G.Node, error) {
	w := newParam("probe", x.Dtype(), false, x.Shape(), func(int) float64 { return rng.NormFloat64() })
	wn := b.Bind("probe", w.Value)
	p, err := G.HadamardProd(x, wn)
	if err != nil {
		return nil, err
	}
	return G.Sum(p)
}
