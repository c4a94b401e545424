package graph

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	G "gorgonia.org/gorgonia"
	"gorgonia.org/tensor"
)

// model is a test graph: data inputs rebound every run, parameters, the
// outputs compared with TapeMachine (those it does not overwrite in place),
// and the gradients of the parameters.
type model struct {
	name    string
	g       *G.ExprGraph
	data    []*G.Node
	params  []*G.Node
	outputs []*G.Node
	cost    *G.Node
	grads   G.Nodes
}

// withGrads adds the gradients of the cost with respect to the parameters
// to m and returns it.
func (m *model) withGrads(t testing.TB) *model {
	t.Helper()
	grads, err := G.Grad(m.cost, m.params...)
	if err != nil {
		t.Fatal(err)
	}
	m.grads = grads
	return m
}

type builder func(t testing.TB, dt tensor.Dtype) *model

func randDense(rng *rand.Rand, dt tensor.Dtype, shape ...int) *tensor.Dense {
	size := 1
	for _, s := range shape {
		size *= s
	}
	switch dt {
	case tensor.Float32:
		b := make([]float32, size)
		for i := range b {
			b[i] = float32(rng.NormFloat64() * 0.5)
		}
		return tensor.New(tensor.WithShape(shape...), tensor.WithBacking(b))
	default:
		b := make([]float64, size)
		for i := range b {
			b[i] = rng.NormFloat64() * 0.5
		}
		return tensor.New(tensor.WithShape(shape...), tensor.WithBacking(b))
	}
}

func oneHot(rng *rand.Rand, dt tensor.Dtype, batch, classes int) *tensor.Dense {
	t := tensor.New(tensor.Of(dt), tensor.WithShape(batch, classes))
	for r := 0; r < batch; r++ {
		c := rng.IntN(classes)
		var one any = 1.0
		if dt == tensor.Float32 {
			one = float32(1)
		}
		if err := t.SetAt(one, r, c); err != nil {
			panic(err)
		}
	}
	return t
}

func param(g *G.ExprGraph, rng *rand.Rand, dt tensor.Dtype, name string, shape ...int) *G.Node {
	v := randDense(rng, dt, shape...)
	if len(shape) == 1 {
		return G.NewVector(g, dt, G.WithShape(shape...), G.WithName(name), G.WithValue(v))
	}
	return G.NewMatrix(g, dt, G.WithShape(shape...), G.WithName(name), G.WithValue(v))
}

// buildMLP is a multi-layer perceptron with ReLU, softmax and a
// cross-entropy cost (through Log(SoftMax) or LogSoftMax).
func buildMLP(sizes []int, batch int, logSoftmax bool) builder {
	return func(t testing.TB, dt tensor.Dtype) *model {
		rng := rand.New(rand.NewPCG(1, 2))
		g := G.NewGraph()
		m := &model{name: fmt.Sprintf("mlp%v/%v", sizes, dt), g: g}
		x := G.NewMatrix(g, dt, G.WithShape(batch, sizes[0]), G.WithName("x"))
		y := G.NewMatrix(g, dt, G.WithShape(batch, sizes[len(sizes)-1]), G.WithName("y"))
		m.data = []*G.Node{x, y}
		h := x
		for l := 0; l+1 < len(sizes); l++ {
			w := param(g, rng, dt, fmt.Sprintf("w%d", l), sizes[l], sizes[l+1])
			b := param(g, rng, dt, fmt.Sprintf("b%d", l), sizes[l+1])
			m.params = append(m.params, w, b)
			z := G.Must(G.Mul(h, w))
			z = G.Must(G.BroadcastAdd(z, b, nil, []byte{0}))
			if l+2 < len(sizes) {
				z = G.Must(G.Rectify(z))
			}
			h = z
		}
		var logp *G.Node
		if logSoftmax {
			logp = G.Must(G.LogSoftMax(h))
		} else {
			logp = G.Must(G.Log(G.Must(G.SoftMax(h))))
		}
		ce := G.Must(G.Sum(G.Must(G.HadamardProd(y, logp)), 1))
		m.cost = G.Must(G.Neg(G.Must(G.Mean(ce))))
		m.outputs = []*G.Node{h, logp, m.cost}
		return m.withGrads(t)
	}
}

// buildMatmul is a chain of matrix products with a transposed operand and a
// tanh, reduced to a scalar.
func buildMatmul(t testing.TB, dt tensor.Dtype) *model {
	rng := rand.New(rand.NewPCG(3, 4))
	g := G.NewGraph()
	m := &model{name: fmt.Sprintf("matmul/%v", dt), g: g}
	a := G.NewMatrix(g, dt, G.WithShape(6, 5), G.WithName("a"))
	m.data = []*G.Node{a}
	b := param(g, rng, dt, "b", 5, 7)
	c := param(g, rng, dt, "c", 4, 7)
	ab := G.Must(G.Mul(a, b))                        // 6x7
	abc := G.Must(G.Mul(ab, G.Must(G.Transpose(c)))) // 6x4
	th := G.Must(G.Tanh(abc))
	sq := G.Must(G.HadamardProd(th, th))
	m.cost = G.Must(G.Sum(sq))
	m.params = []*G.Node{b, c}
	m.outputs = []*G.Node{m.cost}
	return m.withGrads(t)
}

// buildBroadcast adds a row vector and a column vector to a matrix by
// broadcasting, with independent branches that can run in parallel.
func buildBroadcast(t testing.TB, dt tensor.Dtype) *model {
	rng := rand.New(rand.NewPCG(5, 6))
	g := G.NewGraph()
	m := &model{name: fmt.Sprintf("broadcast/%v", dt), g: g}
	x := G.NewMatrix(g, dt, G.WithShape(4, 3), G.WithName("x"))
	m.data = []*G.Node{x}
	row := param(g, rng, dt, "row", 3)
	col := param(g, rng, dt, "col", 4)
	w := param(g, rng, dt, "w", 4, 3)
	r := G.Must(G.BroadcastAdd(x, row, nil, []byte{0}))
	c := G.Must(G.BroadcastAdd(x, col, nil, []byte{1}))
	s1 := G.Must(G.Sigmoid(r))
	s2 := G.Must(G.Tanh(c))
	p := G.Must(G.HadamardProd(G.Must(G.Add(s1, s2)), w))
	m.cost = G.Must(G.Sum(G.Must(G.HadamardProd(p, p))))
	m.params = []*G.Node{row, col, w}
	m.outputs = []*G.Node{m.cost}
	return m.withGrads(t)
}

// bindData gives the model's data inputs fresh values from rng.
func (m *model) dataValues(rng *rand.Rand, dt tensor.Dtype) []G.Value {
	vals := make([]G.Value, len(m.data))
	for i, n := range m.data {
		if n.Name() == "y" {
			s := n.Shape()
			vals[i] = oneHot(rng, dt, s[0], s[1])
			continue
		}
		vals[i] = randDense(rng, dt, n.Shape()...)
	}
	return vals
}

func cloneValue(t testing.TB, v G.Value) G.Value {
	t.Helper()
	if v == nil {
		t.Fatal("nil value")
	}
	c, err := G.CloneValue(v)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func floats(v G.Value) []float64 {
	switch x := v.(type) {
	case *G.F64:
		return []float64{float64(*x)}
	case *G.F32:
		return []float64{float64(*x)}
	case tensor.Tensor:
		d := tensor.Materialize(x).Data()
		switch s := d.(type) {
		case []float64:
			return append([]float64(nil), s...)
		case []float32:
			out := make([]float64, len(s))
			for i, f := range s {
				out[i] = float64(f)
			}
			return out
		case float64:
			return []float64{s}
		case float32:
			return []float64{float64(s)}
		}
	}
	panic(fmt.Sprintf("floats: unhandled %T", v))
}

// assertClose compares two values elementwise with a tolerance fit for dt.
func assertClose(t testing.TB, what string, dt tensor.Dtype, want, got G.Value) {
	t.Helper()
	if want == nil || got == nil {
		t.Fatalf("%s: want %v, got %v", what, want, got)
	}
	if !want.Shape().Eq(got.Shape()) {
		t.Fatalf("%s: shape: want %v, got %v", what, want.Shape(), got.Shape())
	}
	w, g := floats(want), floats(got)
	if len(w) != len(g) {
		t.Fatalf("%s: %d elements, want %d", what, len(g), len(w))
	}
	tol := 1e-12
	if dt == tensor.Float32 {
		tol = 1e-5
	}
	for i := range w {
		if d := math.Abs(w[i] - g[i]); d > tol*(1+math.Abs(w[i])) || math.IsNaN(g[i]) != math.IsNaN(w[i]) {
			t.Fatalf("%s: element %d: want %v, got %v", what, i, w[i], g[i])
		}
	}
}

// naiveEval evaluates every node of g with plain op.Do calls in topological
// order, allocating fresh values: the reference for intermediate values.
func naiveEval(t testing.TB, g *G.ExprGraph) map[*G.Node]G.Value {
	t.Helper()
	sorted, err := G.Sort(g)
	if err != nil {
		t.Fatal(err)
	}
	inputs := map[*G.Node]bool{}
	for _, n := range g.Inputs() {
		inputs[n] = true
	}
	vals := map[*G.Node]G.Value{}
	for i := len(sorted) - 1; i >= 0; i-- {
		n := sorted[i]
		if inputs[n] {
			vals[n] = n.Value()
			continue
		}
		var args []G.Value
		it := g.From(n.ID())
		for it.Next() {
			args = append(args, vals[it.Node().(*G.Node)])
		}
		v, err := n.Op().Do(args...)
		if err != nil {
			t.Fatalf("naive eval of %v: %v", n, err)
		}
		vals[n] = v
	}
	return vals
}
