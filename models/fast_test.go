package models

import (
	"context"
	"errors"
	"math"
	"math/rand/v2"
	"reflect"
	"strings"
	"testing"

	G "gorgonia.org/gorgonia"
	"gorgonia.org/tensor"

	"github.com/tandemml/tandem/graph"
	tblas "github.com/tandemml/tandem/internal/blas"
	"github.com/tandemml/tandem/internal/errs"
)

// randDense returns a tensor of dtype dt filled from rng.
func randDense(rng *rand.Rand, dt tensor.Dtype, shape ...int) *tensor.Dense {
	return newParam("r", dt, false, shape, func(int) float64 { return rng.NormFloat64() }).Value
}

// sameValues reports whether a and b hold the same numbers bit for bit
// (NaNs of any payload count as equal).
func sameValues(a, b G.Value) bool {
	da, oka := a.(*tensor.Dense)
	db, okb := b.(*tensor.Dense)
	if !oka || !okb {
		x, err1 := scalarOf(a)
		y, err2 := scalarOf(b)
		return err1 == nil && err2 == nil && (x == y || x != x && y != y)
	}
	if !da.Shape().Eq(db.Shape()) || da.Dtype() != db.Dtype() {
		return false
	}
	switch x := da.Data().(type) {
	case []float64:
		y := db.Float64s()
		for i := range x {
			if math.Float64bits(x[i]) != math.Float64bits(y[i]) && !(x[i] != x[i] && y[i] != y[i]) {
				return false
			}
		}
	case []float32:
		y := db.Float32s()
		for i := range x {
			if math.Float32bits(x[i]) != math.Float32bits(y[i]) && !(x[i] != x[i] && y[i] != y[i]) {
				return false
			}
		}
	default:
		return reflect.DeepEqual(da.Data(), db.Data())
	}
	return true
}

func fillNaN(v G.Value) {
	switch d := v.Data().(type) {
	case []float64:
		for i := range d {
			d[i] = math.NaN()
		}
	case []float32:
		for i := range d {
			d[i] = float32(math.NaN())
		}
	}
}

// Every op that implements UsePreallocDo writes into a fitting buffer
// (whatever it held before), refuses one that aliases an input or has the
// wrong shape, and computes exactly what Do computes.
func TestUsePreallocDo(t *testing.T) {
	rng := rand.New(rand.NewPCG(71, 72))
	type pcase struct {
		name string
		op   G.UsePreallocDoer
		in   []G.Value
	}
	var cases []pcase
	for _, dt := range []tensor.Dtype{tensor.Float64, tensor.Float32} {
		r := func(shape ...int) G.Value { return randDense(rng, dt, shape...) }
		lab := tensor.New(tensor.WithShape(4), tensor.WithBacking([]int64{2, 0, 1, 2}))
		one, _ := scalarValue(dt, 0.75)
		cs := []pcase{
			{"matmul NN", matMulOp{}, []G.Value{r(3, 4), r(4, 5)}},
			{"matmul NT", matMulOp{transB: true}, []G.Value{r(3, 4), r(5, 4)}},
			{"matmul TN", matMulOp{transA: true}, []G.Value{r(4, 3), r(4, 5)}},
			{"matmul TT", matMulOp{transA: true, transB: true}, []G.Value{r(4, 3), r(5, 4)}},
			{"relu", eltOp{kind: eltReLU}, []G.Value{r(3, 5)}},
			{"gelu", eltOp{kind: eltGELU}, []G.Value{r(3, 5)}},
			{"relu grad", eltGradOp{kind: eltReLU}, []G.Value{r(3, 5), r(3, 5)}},
			{"gelu grad", eltGradOp{kind: eltGELU}, []G.Value{r(3, 5), r(3, 5)}},
			{"bias rows", chanOp{kind: chanAdd, axis: 1, n: 1, inDims: 2, cShape: []int{5}}, []G.Value{r(3, 5), r(5)}},
			{"bias relu rows", chanOp{kind: chanAddReLU, axis: 1, n: 1, inDims: 2, cShape: []int{5}}, []G.Value{r(3, 5), r(5)}},
			{"bias planes", chanOp{kind: chanAdd, axis: 1, n: 1, inDims: 4, cShape: []int{3}}, []G.Value{r(2, 3, 2, 2), r(3)}},
			{"bias relu planes", chanOp{kind: chanAddReLU, axis: 1, n: 1, inDims: 4, cShape: []int{3}}, []G.Value{r(2, 3, 2, 2), r(3)}},
			{"scale planes", chanOp{kind: chanMul, axis: 1, n: 1, inDims: 4, cShape: []int{3}}, []G.Value{r(2, 3, 2, 2), r(3)}},
			{"sum rows", chanOp{kind: chanSum, axis: 1, n: 1, inDims: 2, cShape: []int{5}}, []G.Value{r(3, 5)}},
			{"sum planes", chanOp{kind: chanSum, axis: 1, n: 1, inDims: 4, cShape: []int{3}}, []G.Value{r(2, 3, 2, 2)}},
			{"dot planes", chanOp{kind: chanDot, axis: 1, n: 1, inDims: 4, cShape: []int{3}}, []G.Value{r(2, 3, 2, 2), r(2, 3, 2, 2)}},
			{"xent grad", xentGradOp{xentOp{tDims: 1, zType: dt, tType: tensor.Int64}}, []G.Value{r(4, 3), lab, one}},
			{"pool 2x2", poolOp{k: [2]int{2, 2}, s: [2]int{2, 2}}, []G.Value{r(2, 3, 5, 7)}},
			{"pool 3x3 s2 p1", poolOp{k: [2]int{3, 3}, s: [2]int{2, 2}, p: [2]int{1, 1}}, []G.Value{r(2, 3, 5, 6)}},
			{"pool grad 2x2", poolGradOp{poolOp: poolOp{k: [2]int{2, 2}, s: [2]int{2, 2}}}, []G.Value{r(2, 3, 5, 7), r(2, 3, 2, 3)}},
			{"pool grad 3x3", poolGradOp{poolOp: poolOp{k: [2]int{3, 3}, s: [2]int{2, 2}, p: [2]int{1, 1}}}, []G.Value{r(2, 3, 5, 6), r(2, 3, 3, 3)}},
			{"pool relu grad 2x2", poolGradOp{poolOp: poolOp{k: [2]int{2, 2}, s: [2]int{2, 2}}, relu: true}, []G.Value{r(2, 3, 5, 7), r(2, 3, 2, 3)}},
			{"pool relu grad 3x3", poolGradOp{poolOp: poolOp{k: [2]int{3, 3}, s: [2]int{2, 2}, p: [2]int{1, 1}}, relu: true}, []G.Value{r(2, 3, 5, 6), r(2, 3, 3, 3)}},
		}
		convs := []convParams{
			{k: [2]int{3, 3}, s: [2]int{1, 1}, p: [2]int{1, 1}, d: [2]int{1, 1}}, // wide, padded
			{k: [2]int{3, 2}, s: [2]int{1, 1}, d: [2]int{2, 1}},                  // wide, dilated
			{k: [2]int{3, 3}, s: [2]int{2, 2}, p: [2]int{1, 0}, d: [2]int{1, 1}}, // im2col
			{k: [2]int{1, 1}, s: [2]int{1, 1}, d: [2]int{1, 1}},                  // pointwise
		}
		for _, cp := range convs {
			x, w := r(2, 3, 6, 5), r(4, 3, cp.k[0], cp.k[1])
			ys, err := convOp{convParams: cp}.InferShape(x.Shape(), w.Shape())
			if err != nil {
				t.Fatal(err)
			}
			dy := r(ys...)
			cs = append(cs,
				pcase{"conv " + cp.String(), convOp{convParams: cp, sc: &scratch{}}, []G.Value{x, w}},
				pcase{"conv dx " + cp.String(), convGradXOp{convParams: cp, h: 6, w: 5, sc: &scratch{}}, []G.Value{w, dy}},
				pcase{"conv dw " + cp.String(), convGradWOp{convParams: cp}, []G.Value{x, dy}},
			)
		}
		for _, c := range cs {
			c.name = dt.String() + " " + c.name
			cases = append(cases, c)
		}
	}
	for _, c := range cases {
		op := c.op.(G.Op)
		want, err := op.Do(c.in...)
		if err != nil {
			t.Fatalf("%s: Do: %v", c.name, err)
		}
		// a fitting buffer full of garbage is used and fully overwritten
		buf, err := op.Do(c.in...)
		if err != nil {
			t.Fatal(err)
		}
		fillNaN(buf)
		for run := 0; run < 2; run++ {
			got, err := c.op.UsePreallocDo(buf, c.in...)
			if err != nil {
				t.Fatalf("%s: UsePreallocDo: %v", c.name, err)
			}
			if got.Uintptr() != buf.Uintptr() {
				t.Errorf("%s: a fitting buffer was not used", c.name)
			}
			if !sameValues(got, want) {
				t.Errorf("%s run %d: result in the buffer differs from Do's", c.name, run)
			}
		}
		// an input as the buffer: never written into
		for i, in := range c.in {
			keep, err := G.CloneValue(in)
			if err != nil {
				t.Fatal(err)
			}
			got, err := c.op.UsePreallocDo(in, c.in...)
			if err != nil {
				t.Fatalf("%s: UsePreallocDo(input %d): %v", c.name, i, err)
			}
			if got.Uintptr() == in.Uintptr() || !sameValues(in, keep) {
				t.Errorf("%s: wrote into input %d handed over as the buffer", c.name, i)
			}
			if !sameValues(got, want) {
				t.Errorf("%s: wrong result with input %d as the buffer", c.name, i)
			}
		}
		// a buffer of the wrong shape or dtype is not used
		for _, bad := range []G.Value{randDense(rng, tensor.Float64, 1, 7), randDense(rng, tensor.Float32, 1, 7)} {
			got, err := c.op.UsePreallocDo(bad, c.in...)
			if err != nil {
				t.Fatalf("%s: UsePreallocDo(misfit): %v", c.name, err)
			}
			if got.Uintptr() == bad.Uintptr() || !sameValues(got, want) {
				t.Errorf("%s: misfit buffer used or wrong result", c.name)
			}
		}
	}
	// the loss reuses a scalar of its dtype
	z := randDense(rng, tensor.Float32, 4, 3)
	lab := tensor.New(tensor.WithShape(4), tensor.WithBacking([]int64{2, 0, 1, 2}))
	op := xentOp{tDims: 1, zType: tensor.Float32, tType: tensor.Int64}
	want, _ := op.Do(z, lab)
	pre := G.NewF32(-1)
	got, err := op.UsePreallocDo(pre, z, lab)
	if err != nil || got != G.Value(pre) || !sameValues(got, want) {
		t.Errorf("cross entropy into a scalar: %v %v, want %v in the same scalar", got, err, want)
	}
}

// The 2×2 stride-2 pooling kernels agree exactly with the general ones,
// ties (first maximum), signed zeros, NaNs (first NaN) and odd sizes
// included.
func TestPool2MatchesGeneric(t *testing.T) {
	rng := rand.New(rand.NewPCG(81, 82))
	pick := []float64{-1, 0, math.Copysign(0, -1), 1, 2, math.NaN()}
	op := poolOp{k: [2]int{2, 2}, s: [2]int{2, 2}}
	for _, shape := range [][]int{{2, 3, 6, 8}, {1, 2, 5, 7}, {1, 1, 3, 2}} {
		s := tensor.Shape(shape)
		n := s.TotalSize()
		oh, ow := op.outHW(s[2], s[3])
		x := make([]float64, n)
		for i := range x {
			x[i] = pick[rng.IntN(len(pick))]
			if i%7 == 0 {
				x[i] = rng.NormFloat64()
			}
		}
		dy := make([]float64, s[0]*s[1]*oh*ow)
		for i := range dy {
			dy[i] = rng.NormFloat64()
		}
		check := func(name string, fast, slow []float64) {
			t.Helper()
			for i := range fast {
				if fast[i] != slow[i] && !(fast[i] != fast[i] && slow[i] != slow[i]) {
					t.Fatalf("%v %s[%d]: fast %v, general %v", shape, name, i, fast[i], slow[i])
				}
			}
		}
		out, ref := make([]float64, len(dy)), make([]float64, len(dy))
		pool2Forward(s, x, out)
		poolGeneric(op, s, x, ref, nil, nil, false)
		check("forward", out, ref)
		for _, relu := range []bool{false, true} {
			dx, dref := make([]float64, n), make([]float64, n)
			for i := range dx {
				dx[i] = math.NaN() // stale buffer contents must be overwritten
			}
			pool2Backward(s, x, dy, dx, relu)
			poolGeneric(op, s, x, nil, dy, dref, relu)
			check("backward", dx, dref)
			if relu { // the ReLU's derivative, applied after the plain pool gradient
				plain := make([]float64, n)
				poolGeneric(op, s, x, nil, dy, plain, false)
				for i := range plain {
					if !(x[i] > 0) {
						plain[i] = 0
					}
				}
				check("relu backward", dx, plain)
			}
		}

		x32, dy32 := make([]float32, n), make([]float32, len(dy))
		for i, v := range x {
			x32[i] = float32(v)
		}
		for i, v := range dy {
			dy32[i] = float32(v)
		}
		dx32, dref32 := make([]float32, n), make([]float32, n)
		pool2Backward(s, x32, dy32, dx32, false)
		poolGeneric(op, s, x32, nil, dy32, dref32, false)
		for i := range dx32 {
			if dx32[i] != dref32[i] {
				t.Fatalf("%v float32 backward[%d]: fast %v, general %v", shape, i, dx32[i], dref32[i])
			}
		}
	}
}

// The stride-1 wide layout and the 1×1 shortcut compute what im2col and
// col2im compute.
func TestConvWideMatchesIm2col(t *testing.T) {
	rng := rand.New(rand.NewPCG(91, 92))
	for _, cp := range []convParams{
		{k: [2]int{5, 5}, s: [2]int{1, 1}, p: [2]int{2, 2}, d: [2]int{1, 1}},
		{k: [2]int{3, 2}, s: [2]int{1, 1}, p: [2]int{0, 3}, d: [2]int{2, 1}},
		{k: [2]int{2, 3}, s: [2]int{1, 1}, d: [2]int{1, 1}},
		{k: [2]int{1, 1}, s: [2]int{1, 1}, d: [2]int{1, 1}},
	} {
		g, err := cp.geom(tensor.Shape{3, 2, 7, 6}, 4)
		if err != nil {
			t.Fatal(err)
		}
		ck, p, in := g.ck(), g.p(), g.c*g.h*g.w
		x := randDense(rng, tensor.Float64, 3, 2, 7, 6).Float64s()
		w := randDense(rng, tensor.Float64, 4, ck).Float64s()
		dy := randDense(rng, tensor.Float64, 3, 4, p).Float64s()
		// references through im2col, sample by sample
		y, dw, dx := make([]float64, g.n*g.o*p), make([]float64, g.o*ck), make([]float64, g.n*in)
		col := make([]float64, ck*p)
		for n := 0; n < g.n; n++ {
			im2col(g, x[n*in:(n+1)*in], col)
			naiveGemm(false, false, g.o, p, ck, w, col, y[n*g.o*p:], 0)
			naiveGemm(false, true, g.o, ck, p, dy[n*g.o*p:], col, dw, 1)
			naiveGemm(true, false, ck, p, g.o, w, dy[n*g.o*p:], col, 0)
			col2im(g, col, dx[n*in:(n+1)*in])
		}
		gy, gdw, gdx := make([]float64, len(y)), make([]float64, len(dw)), make([]float64, len(dx))
		sc := &scratch{}
		for run := 0; run < 2; run++ { // the second run gets used scratch buffers
			convForward(g, sc, tblas.Dgemm, x, w, gy)
			convGradW(g, sc, tblas.Dgemm, x, dy, gdw)
			convGradX(g, sc, tblas.Dgemm, w, dy, gdx)
			for _, c := range []struct {
				name      string
				got, want []float64
			}{{"y", gy, y}, {"dw", gdw, dw}, {"dx", gdx, dx}} {
				for i := range c.want {
					if math.Abs(c.got[i]-c.want[i]) > 1e-12 {
						t.Fatalf("%v run %d: %s[%d] = %v, im2col gives %v", cp, run, c.name, i, c.got[i], c.want[i])
					}
				}
			}
		}
	}
}

// naiveGemm computes c (m×n) = beta·c + op(a)·op(b) by the definition, for
// row-major operands without padding.
func naiveGemm(tA, tB bool, m, n, k int, a, b, c []float64, beta float64) {
	for i := 0; i < m; i++ {
		for j := 0; j < n; j++ {
			var s float64
			for l := 0; l < k; l++ {
				av, bv := a[i*k+l], b[l*n+j]
				if tA {
					av = a[l*m+i]
				}
				if tB {
					bv = b[j*k+l]
				}
				s += av * bv
			}
			c[i*n+j] = beta*c[i*n+j] + s
		}
	}
}

// trainGraph builds model's loss on a batch of x with labels lab.
func trainGraph(t *testing.T, m Module, x *tensor.Dense, lab *tensor.Dense) (*Builder, *G.Node) {
	t.Helper()
	b := NewBuilder(nil)
	y, err := m.Forward(b, b.Bind("x", x))
	if err != nil {
		t.Fatal(err)
	}
	loss, err := CrossEntropy(y, b.Bind("y", lab))
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Backward(loss); err != nil {
		t.Fatal(err)
	}
	return b, loss
}

// The graph executor (sequential and parallel), reusing every op's output
// buffer from run to run, computes bit for bit what gorgonia's TapeMachine
// computes, run after run with new inputs; so do TapeMachines that are
// reused.
func TestExecutorsAgreeWithBufferReuse(t *testing.T) {
	rng := rand.New(rand.NewPCG(101, 102))
	cases := []struct {
		name   string
		model  func(dt tensor.Dtype) Module
		xshape []int
	}{
		{"mlp", func(dt tensor.Dtype) Module {
			m, _ := NewMLP([]int{6, 8, 8, 3}, WithRand(rand.New(rand.NewPCG(1, 1))), WithDtype(dt))
			return m
		}, []int{5, 6}},
		{"mlp gelu", func(dt tensor.Dtype) Module {
			m, _ := NewMLP([]int{6, 8, 3}, WithActivation(ActGELU), WithRand(rand.New(rand.NewPCG(1, 1))), WithDtype(dt))
			return m
		}, []int{5, 6}},
		{"cnn", func(dt tensor.Dtype) Module {
			m, _ := NewCNN(CNNConfig{Size: 8, Channels1: 3, Channels2: 4, Kernel: 3, Hidden: 6, Classes: 3}, rand.New(rand.NewPCG(1, 1)), WithDtype(dt))
			return m
		}, []int{5, 1, 8, 8}},
	}
	for k, c := range cases {
		for d, dt := range []tensor.Dtype{tensor.Float64, tensor.Float32} {
			workers := 1 + (k+d)%2 // the parallel executor too
			mg, mt := c.model(dt), c.model(dt)
			x := randDense(rng, dt, c.xshape...)
			xt := x.Clone().(*tensor.Dense)
			lab := tensor.New(tensor.WithShape(5), tensor.WithBacking([]int64{0, 2, 1, 1, 2}))
			bg, lossG := trainGraph(t, mg, x, lab)
			bt, lossT := trainGraph(t, mt, xt, lab)
			prog, err := graph.Compile(bg.Graph(), graph.Workers(workers), graph.WithGrads(bg.ParamNodes(), bg.GradNodes()))
			if err != nil {
				t.Fatal(err)
			}
			vm := G.NewTapeMachine(bt.Graph())
			for run := 0; run < 3; run++ {
				fresh := randDense(rng, dt, c.xshape...)
				for _, d := range []*tensor.Dense{x, xt} {
					if _, err := G.Copy(d, fresh); err != nil { // refill the bound inputs in place
						t.Fatal(err)
					}
				}
				if err := prog.Run(context.Background()); err != nil {
					t.Fatal(err)
				}
				vm.Reset()
				if err := vm.RunAll(); err != nil {
					t.Fatal(err)
				}
				if !sameValues(lossG.Value(), lossT.Value()) {
					t.Fatalf("%s %v workers %d run %d: loss %v (graph) vs %v (tape)", c.name, dt, workers, run, lossG.Value(), lossT.Value())
				}
				for _, b := range []*Builder{bg, bt} {
					if err := b.CopyGrads(); err != nil {
						t.Fatal(err)
					}
				}
				for i, p := range mg.Params() {
					if !sameValues(p.Grad, mt.Params()[i].Grad) {
						t.Fatalf("%s %v workers %d run %d: gradient of %s differs", c.name, dt, workers, run, p.Name)
					}
				}
			}
			vm.Close()
		}
	}
}

// countOps counts the nodes of g whose op prints with the given prefix.
func countOps(g *G.ExprGraph, prefix string) int {
	n := 0
	for _, nd := range g.AllNodes() {
		if nd.Op() != nil && strings.HasPrefix(nd.Op().String(), prefix) {
			n++
		}
	}
	return n
}

// Backward builds no gradient for the bound input batch, while
// gorgonia.Grad called directly still differentiates with respect to it.
func TestBackwardSkipsDataGradients(t *testing.T) {
	rng := rand.New(rand.NewPCG(111, 112))
	m, _ := NewMLP([]int{4, 6, 3}, WithRand(rng), WithDtype(tensor.Float64))
	x := randDense(rng, tensor.Float64, 2, 4)
	lab := tensor.New(tensor.WithShape(2), tensor.WithBacking([]int64{0, 2}))
	b, _ := trainGraph(t, m, x, lab)
	// forward 2, weight gradients 2, one input gradient (of the hidden layer)
	if got := countOps(b.Graph(), "MatMulT"); got != 5 {
		t.Errorf("%d matrix products, want 5 (no gradient of the input batch)", got)
	}
	cnn, _ := NewCNN(CNNConfig{Size: 8, Channels1: 2, Channels2: 3, Kernel: 3, Hidden: 4, Classes: 3}, rng, WithDtype(tensor.Float64))
	b, _ = trainGraph(t, cnn, randDense(rng, tensor.Float64, 2, 1, 8, 8), lab)
	if got := countOps(b.Graph(), "Conv2dGradX"); got != 1 {
		t.Errorf("%d convolution input gradients, want 1 (none for the input batch)", got)
	}

	// Directly: d sum(x·Wᵀ + b)/dx = column sums of W.
	l, _ := NewLinear(4, 3, WithRand(rng), WithDtype(tensor.Float64))
	b = NewBuilder(nil)
	xn := b.Bind("x", randDense(rng, tensor.Float64, 2, 4))
	y, _ := l.Forward(b, xn)
	s, _ := G.Sum(y)
	grads, err := G.Grad(s, xn)
	if err != nil {
		t.Fatal(err)
	}
	vm := G.NewTapeMachine(b.Graph())
	defer vm.Close()
	run(t, vm)
	w := l.Weight.Value.Float64s()
	got := grads[0].Value().Data().([]float64)
	for r := 0; r < 2; r++ {
		for k := 0; k < 4; k++ {
			want := w[k] + w[4+k] + w[8+k]
			if math.Abs(got[r*4+k]-want) > 1e-12 {
				t.Fatalf("dx[%d,%d] = %v, want %v", r, k, got[r*4+k], want)
			}
		}
	}
}

// A Linear or Conv2d followed by a ReLU in a Sequential is built as one
// bias+ReLU pass, and a max pool after a ReLU applies the ReLU's derivative
// in its own backward pass; both compute exactly what the layers compute
// apart.
func TestFusedBiasReLU(t *testing.T) {
	// a ReLU that is not recognised: its output goes through a reshape
	unfused := Func(func(_ *Builder, x *G.Node) (*G.Node, error) {
		y, err := applyElt(eltReLU, x)
		if err != nil {
			return nil, err
		}
		return G.Reshape(y, y.Shape())
	})
	for _, dt := range []tensor.Dtype{tensor.Float64, tensor.Float32} {
		build := func(act Module) *Sequential {
			rng := rand.New(rand.NewPCG(121, 122))
			c, _ := NewConv2d(1, 2, 3, WithPadding(1, 1), WithRand(rng), WithDtype(dt))
			pool, _ := NewMaxPool2d(2)
			l1, _ := NewLinear(2*2*2, 5, WithRand(rng), WithDtype(dt))
			l2, _ := NewLinear(5, 3, WithRand(rng), WithDtype(dt))
			return NewSequential(c, act, pool, Flatten{}, l1, act, l2)
		}
		fused, plain := build(ReLU{}), build(unfused)
		rng := rand.New(rand.NewPCG(5, 6))
		x := randDense(rng, dt, 3, 1, 4, 4)
		lab := tensor.New(tensor.WithShape(3), tensor.WithBacking([]int64{2, 0, 1}))
		bf, lf := trainGraph(t, fused, x, lab)
		bp, lp := trainGraph(t, plain, x, lab)
		if got := countOps(bf.Graph(), "ChanAddReLU"); got != 2 {
			t.Errorf("%v: %d fused bias+ReLU nodes, want 2", dt, got)
		}
		if got := countOps(bp.Graph(), "ChanAddReLU"); got != 0 {
			t.Errorf("%v: unfused model has %d fused nodes", dt, got)
		}
		// the pool after the conv's ReLU masks; the Linear's ReLU has its own pass
		if got, want := countOps(bf.Graph(), "GradReLUMaxPool2d"), 1; got != want {
			t.Errorf("%v: %d ReLU-masking pool gradients, want %d", dt, got, want)
		}
		if got, want := countOps(bf.Graph(), "ReLUGrad"), 1; got != want {
			t.Errorf("%v: %d ReLU gradient passes, want %d", dt, got, want)
		}
		if got, want := countOps(bp.Graph(), "ReLUGrad"), 2; got != want {
			t.Errorf("%v: unfused model has %d ReLU gradient passes, want %d", dt, got, want)
		}
		for _, b := range []*Builder{bf, bp} {
			vm := G.NewTapeMachine(b.Graph())
			run(t, vm)
			vm.Close()
			if err := b.CopyGrads(); err != nil {
				t.Fatal(err)
			}
		}
		if !sameValues(lf.Value(), lp.Value()) {
			t.Errorf("%v: loss %v fused, %v apart", dt, lf.Value(), lp.Value())
		}
		for i, p := range fused.Params() {
			if q := plain.Params()[i]; p.Name != q.Name || !sameValues(p.Grad, q.Grad) {
				t.Errorf("%v: gradient of %s differs (vs %s)", dt, p.Name, q.Name)
			}
		}
	}
}

// ReLU maps NaN to NaN, as PyTorch's does; its derivative is 0 at 0 and
// at NaN, and 1 for positive inputs.
func TestReLUSpecialValues(t *testing.T) {
	nan := math.NaN()
	x := []float64{nan, 0, math.Copysign(0, -1), -1, 2, math.Inf(1), math.Inf(-1)}
	dy := []float64{1, 2, 3, 4, 5, 6, 7}
	out := make([]float64, len(x))
	eltForward(eltReLU, out, x)
	want := []float64{nan, 0, 0, 0, 2, math.Inf(1), 0}
	for i := range want {
		if out[i] != want[i] && !(out[i] != out[i] && want[i] != want[i]) {
			t.Errorf("relu(%v) = %v, want %v", x[i], out[i], want[i])
		}
	}
	eltBackward(eltReLU, out, x, dy)
	wantGrad := []float64{0, 0, 0, 0, 5, 6, 0}
	x32, dy32, out32 := make([]float32, len(x)), make([]float32, len(x)), make([]float32, len(x))
	for i := range x {
		x32[i], dy32[i] = float32(x[i]), float32(dy[i])
	}
	eltBackward(eltReLU, out32, x32, dy32)
	for i := range wantGrad {
		if out[i] != wantGrad[i] || float64(out32[i]) != wantGrad[i] {
			t.Errorf("relu'(%v)·%v = %v (float32 %v), want %v", x[i], dy[i], out[i], out32[i], wantGrad[i])
		}
	}
}

// With WithGradsInPlace the runs of the program Builder.Compile returns
// write the gradients of Linear, Conv2d and LayerNorm parameters straight
// into Param.Grad (same tensors run after run), CopyGrads supplies the rest,
// and the values are exactly those of the default Builder; under
// TapeMachine, which knows nothing of the targets, CopyGrads copies them
// all, to the same values. AccumulateGrads is refused.
func TestGradsInPlace(t *testing.T) {
	rng := rand.New(rand.NewPCG(131, 132))
	build := func(dt tensor.Dtype) *Sequential {
		r := rand.New(rand.NewPCG(7, 8))
		c, _ := NewConv2d(1, 2, 3, WithPadding(1, 1), WithRand(r), WithDtype(dt))
		ln, _ := NewLayerNorm([]int{2 * 4 * 4}, WithDtype(dt))
		emb := Func(func(_ *Builder, x *G.Node) (*G.Node, error) { return G.Tanh(x) })
		l1, _ := NewLinear(2*4*4, 5, WithRand(r), WithDtype(dt))
		l2, _ := NewLinear(5, 3, WithRand(r), WithDtype(dt))
		return NewSequential(c, ReLU{}, Flatten{}, ln, emb, l1, ReLU{}, l2)
	}
	for _, dt := range []tensor.Dtype{tensor.Float64, tensor.Float32} {
		for _, executor := range []string{"graph", "tape"} {
			mi, md := build(dt), build(dt)
			x := randDense(rng, dt, 3, 1, 4, 4)
			lab := tensor.New(tensor.WithShape(3), tensor.WithBacking([]int64{2, 0, 1}))
			bi := NewBuilder(nil, WithGradsInPlace())
			yi, err := mi.Forward(bi, bi.Bind("x", x))
			if err != nil {
				t.Fatal(err)
			}
			li, _ := CrossEntropy(yi, bi.Bind("y", lab))
			if err := bi.Backward(li); err != nil {
				t.Fatal(err)
			}
			bd, _ := trainGraph(t, md, x, lab)
			grads := map[*Param]*tensor.Dense{}
			for _, p := range mi.Params() {
				if p.Grad == nil {
					t.Fatalf("%s: Backward allocated no Grad", p.Name)
				}
				grads[p] = p.Grad
			}
			var runI, runD func()
			inPlace := 0 // gradients the run writes into Param.Grad
			switch executor {
			case "graph":
				inPlace = 8 // conv, layer norm and linear weights and biases: all
				pi, err := bi.Compile(graph.Workers(1))
				if err != nil {
					t.Fatal(err)
				}
				pd, err := graph.Compile(bd.Graph(), graph.Workers(1))
				if err != nil {
					t.Fatal(err)
				}
				runI = func() {
					if err := pi.Run(context.Background()); err != nil {
						t.Fatal(err)
					}
				}
				runD = func() {
					if err := pd.Run(context.Background()); err != nil {
						t.Fatal(err)
					}
				}
			case "tape":
				vi, vd := G.NewTapeMachine(bi.Graph()), G.NewTapeMachine(bd.Graph())
				defer vi.Close()
				defer vd.Close()
				runI = func() { run(t, vi) }
				runD = func() { run(t, vd) }
			}
			for step := 0; step < 3; step++ {
				if _, err := G.Copy(x, randDense(rng, dt, 3, 1, 4, 4)); err != nil {
					t.Fatal(err)
				}
				for _, p := range mi.Params() {
					p.Grad.Zero() // as an optimizer's ZeroGrad before the run
				}
				runI()
				runD()
				if err := bd.CopyGrads(); err != nil {
					t.Fatal(err)
				}
				written := 0
				for i, p := range mi.Params() {
					if p.Grad != grads[p] {
						t.Fatalf("%s: Grad replaced", p.Name)
					}
					if sameValues(p.Grad, md.Params()[i].Grad) {
						written++
					}
				}
				if written != inPlace {
					t.Errorf("%v %s step %d: %d gradients written by the run, want %d", dt, executor, step, written, inPlace)
				}
				if err := bi.CopyGrads(); err != nil {
					t.Fatal(err)
				}
				for i, p := range mi.Params() {
					if !sameValues(p.Grad, md.Params()[i].Grad) {
						t.Errorf("%v %s step %d: %s differs from the default builder's", dt, executor, step, p.Name)
					}
				}
			}
			if err := bi.AccumulateGrads(); !errors.Is(err, errs.InvalidArgument) {
				t.Errorf("AccumulateGrads in place: %v", err)
			}
		}
	}
}
