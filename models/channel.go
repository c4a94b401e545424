package models

import (
	"errors"
	"fmt"
	"hash"

	"github.com/chewxy/hm"
	G "gorgonia.org/gorgonia"
	"gorgonia.org/tensor"

	"github.com/tandemml/tandem/internal/errs"
	"github.com/tandemml/tandem/internal/opkit"
	"github.com/tandemml/tandem/internal/vec"
)

// The channel ops view x as [outer, C, inner], where C is the product of the
// axes [axis, axis+n) of x, and apply a per-channel vector c (of C elements,
// any shape) along those axes: Linear's bias is axis=last, n=1; Conv2d's and
// BatchNorm2d's are axis=1, n=1 on NCHW; LayerNorm's affine covers the
// trailing normalised axes. Each op is one pass with no broadcast copies.

type chanKind int

const (
	chanAdd     chanKind = iota // (x, c) -> x + c
	chanMul                     // (x, c) -> x * c
	chanSum                     // (x) -> Σ_{outer,inner} x            (shape of c)
	chanDot                     // (x, y) -> Σ_{outer,inner} x*y       (shape of c)
	chanAddReLU                 // (x, c) -> max(x + c, 0): a bias followed by ReLU, in one pass
)

func (k chanKind) String() string {
	return [...]string{"ChanAdd", "ChanMul", "ChanSum", "ChanDot", "ChanAddReLU"}[k]
}

// elementwise reports whether the op maps x to an output of x's shape (as
// opposed to reducing it to the per-channel shape).
func (k chanKind) elementwise() bool { return k == chanAdd || k == chanMul || k == chanAddReLU }

type chanOp struct {
	opkit.Plain
	kind    chanKind
	axis, n int
	inDims  int        // dims of x
	cShape  []int      // shape of the per-channel tensor
	scale   *gradScale // multiplies a gradient reduction (see Builder.SetGradTarget)
}

func (op chanOp) Arity() int {
	if op.kind == chanSum {
		return 1
	}
	return 2
}

func (op chanOp) Type() hm.Type {
	a := hm.TypeVariable('a')
	x := G.TensorType{Dims: op.inDims, Of: a}
	var c hm.Type = G.TensorType{Dims: len(op.cShape), Of: a}
	if len(op.cShape) == 0 {
		c = a
	}
	switch op.kind {
	case chanAdd, chanMul, chanAddReLU:
		return hm.NewFnType(x, c, x)
	case chanSum:
		return hm.NewFnType(x, c)
	default:
		return hm.NewFnType(x, x, c)
	}
}

func (op chanOp) InferShape(in ...G.DimSizer) (tensor.Shape, error) {
	if len(in) != op.Arity() {
		return nil, fmt.Errorf("models: %v takes %d inputs, got %d: %w", op, op.Arity(), len(in), errs.InvalidArgument)
	}
	if op.kind.elementwise() {
		s, err := shapeOf(in[0])
		return s.Clone(), err
	}
	return tensor.Shape(append([]int(nil), op.cShape...)), nil
}

// split returns outer, C, inner for shape s.
func (op chanOp) split(s tensor.Shape) (outer, c, inner int, err error) {
	if len(s) != op.inDims || op.axis+op.n > len(s) {
		return 0, 0, 0, fmt.Errorf("models: %v expects a %d-dimensional input, got shape %v: %w", op, op.inDims, s, errs.InvalidArgument)
	}
	outer, c, inner = 1, 1, 1
	for i, d := range s {
		switch {
		case i < op.axis:
			outer *= d
		case i < op.axis+op.n:
			c *= d
		default:
			inner *= d
		}
	}
	want := 1
	for _, d := range op.cShape {
		want *= d
	}
	if want != c {
		return 0, 0, 0, fmt.Errorf("models: %v: input shape %v has %d channels on axes [%d,%d), parameter has %d: %w", op, s, c, op.axis, op.axis+op.n, want, errs.InvalidArgument)
	}
	return outer, c, inner, nil
}

func (op chanOp) Do(in ...G.Value) (G.Value, error) { return op.UsePreallocDo(nil, in...) }

// UsePreallocDo writes the result into prealloc when it fits (see outDense).
func (op chanOp) UsePreallocDo(prealloc G.Value, in ...G.Value) (G.Value, error) {
	if len(in) != op.Arity() {
		return nil, fmt.Errorf("models: %v takes %d inputs, got %d: %w", op, op.Arity(), len(in), errs.InvalidArgument)
	}
	x, err := denseOf(in[0])
	if err != nil {
		return nil, err
	}
	var y *tensor.Dense
	if len(in) == 2 {
		if y, err = denseOf(in[1]); err != nil {
			return nil, err
		}
		if y.Dtype() != x.Dtype() {
			return nil, fmt.Errorf("models: %v dtype mismatch: %v and %v: %w", op, x.Dtype(), y.Dtype(), errs.InvalidArgument)
		}
	}
	outer, c, inner, err := op.split(x.Shape())
	if err != nil {
		return nil, err
	}
	var out *tensor.Dense
	if op.kind.elementwise() {
		out = outDense(prealloc, x.Dtype(), x.Shape(), in...)
	} else {
		shape := op.cShape
		if len(shape) == 0 {
			shape = []int{1}
		}
		out = outDense(prealloc, x.Dtype(), shape, in...)
		out.Zero() // the reductions accumulate
	}
	switch x.Dtype() {
	case tensor.Float64:
		err = chanKernel(op.kind, outer, c, inner, out.Float64s(), x.Float64s(), floats[float64](y))
	case tensor.Float32:
		err = chanKernel(op.kind, outer, c, inner, out.Float32s(), x.Float32s(), floats[float32](y))
	default:
		err = checkFloat(x.Dtype())
	}
	if err != nil {
		return nil, fmt.Errorf("models: %v: %w", op, err)
	}
	scaleDense(out, op.scale.factor())
	return out, nil
}

func floats[T float](t *tensor.Dense) []T {
	if t == nil {
		return nil
	}
	d, _ := sliceOf[T](t)
	return d
}

func chanKernel[T float](k chanKind, outer, c, inner int, out, x, y []T) error {
	switch k {
	case chanAdd, chanMul, chanAddReLU:
		if len(y) != c {
			return fmt.Errorf("per-channel tensor has %d elements, want %d: %w", len(y), c, errs.InvalidArgument)
		}
		if len(x) != outer*c*inner || len(out) != len(x) {
			return fmt.Errorf("input has %d elements, want %d: %w", len(x), outer*c*inner, errs.InvalidArgument)
		}
		if inner == 1 {
			// channels last (a Linear's bias): whole rows at a time.
			for o := 0; o < outer; o++ {
				chanRow(k, out[o*c:(o+1)*c], x[o*c:(o+1)*c], y)
			}
			return nil
		}
		i := 0
		for o := 0; o < outer; o++ {
			for ch := 0; ch < c; ch++ {
				chanSeg(k, out[i:i+inner], x[i:i+inner], y[ch])
				i += inner
			}
		}
	case chanSum:
		if inner == 1 {
			out = out[:c]
			o32, is32 := any(out).([]float32)
			for o := 0; o < outer; o++ {
				row := x[o*c : (o+1)*c]
				if is32 {
					vec.AddTo(o32, any(row).([]float32))
					continue
				}
				for j, xv := range row {
					out[j] += xv
				}
			}
			return nil
		}
		i := 0
		for o := 0; o < outer; o++ {
			for ch := 0; ch < c; ch++ {
				var s T
				for _, xv := range x[i : i+inner] {
					s += xv
				}
				out[ch] += s
				i += inner
			}
		}
	case chanDot:
		if len(y) != len(x) {
			return fmt.Errorf("operands have %d and %d elements: %w", len(x), len(y), errs.InvalidArgument)
		}
		i := 0
		for o := 0; o < outer; o++ {
			for ch := 0; ch < c; ch++ {
				var s T
				for j, xv := range x[i : i+inner] {
					s += xv * y[i+j]
				}
				out[ch] += s
				i += inner
			}
		}
	}
	return nil
}

// chanRow applies a whole per-channel vector y to one row x (float32 in
// package vec's kernels).
func chanRow[T float](k chanKind, dst, x, y []T) {
	dst, y = dst[:len(x)], y[:len(x)]
	if d, ok := any(dst).([]float32); ok {
		x, y := any(x).([]float32), any(y).([]float32)
		switch k {
		case chanAdd:
			vec.Add(d, x, y)
		case chanMul:
			vec.Mul(d, x, y)
		case chanAddReLU:
			vec.AddReLU(d, x, y)
		}
		return
	}
	switch k {
	case chanAdd:
		for j, xv := range x {
			dst[j] = xv + y[j]
		}
	case chanMul:
		for j, xv := range x {
			dst[j] = xv * y[j]
		}
	case chanAddReLU:
		for j, xv := range x {
			dst[j] = max(xv+y[j], 0)
		}
	}
}

// chanSeg applies one channel's value v to the run x of that channel.
func chanSeg[T float](k chanKind, dst, x []T, v T) {
	dst = dst[:len(x)]
	switch k {
	case chanAdd:
		for j, xv := range x {
			dst[j] = xv + v
		}
	case chanMul:
		for j, xv := range x {
			dst[j] = xv * v
		}
	case chanAddReLU:
		for j, xv := range x {
			dst[j] = max(xv+v, 0)
		}
	}
}

func (op chanOp) WriteHash(h hash.Hash) { fmt.Fprint(h, op.String()) }
func (op chanOp) Hashcode() uint32      { return opkit.HashString(op) }
func (op chanOp) String() string {
	return fmt.Sprintf("%v{axis:%d,n:%d,dims:%d,c:%v}", op.kind, op.axis, op.n, op.inDims, op.cShape)
}

func (op chanOp) DiffWRT(int) []bool {
	switch op.kind {
	case chanAdd, chanMul, chanAddReLU:
		return []bool{true, true}
	}
	if op.kind == chanSum {
		return []bool{false}
	}
	return []bool{false, false}
}

// SymDiff: for x + c, dx = dy and dc = Σ dy; for x * c, dx = dy * c and
// dc = Σ dy*x (sums over outer and inner positions); for y = max(x + c, 0),
// dx = dy where y > 0 (else 0, PyTorch's derivative at 0) and dc = Σ dx.
// The ReLU mask is read from the output, which is positive exactly where
// x + c is.
func (op chanOp) SymDiff(in G.Nodes, out, grad *G.Node) (G.Nodes, error) {
	switch op.kind {
	case chanAddReLU:
		dx := grad // when a max pool already applied the ReLU's derivative
		if !maskedPoolGrad(grad, out) {
			var err error
			if dx, err = G.ApplyOp(eltGradOp{kind: eltReLU}, out, grad); err != nil {
				return nil, err
			}
		}
		dc, err := G.ApplyOp(chanOp{kind: chanSum, axis: op.axis, n: op.n, inDims: op.inDims, cShape: op.cShape, scale: &gradScale{}}, dx)
		if err != nil {
			return nil, err
		}
		return G.Nodes{dx, dc}, nil
	case chanAdd:
		dc, err := G.ApplyOp(chanOp{kind: chanSum, axis: op.axis, n: op.n, inDims: op.inDims, cShape: op.cShape, scale: &gradScale{}}, grad)
		if err != nil {
			return nil, err
		}
		return G.Nodes{grad, dc}, nil
	case chanMul:
		dx, err := G.ApplyOp(op, grad, in[1])
		if err != nil {
			return nil, err
		}
		dc, err := G.ApplyOp(chanOp{kind: chanDot, axis: op.axis, n: op.n, inDims: op.inDims, cShape: op.cShape, scale: &gradScale{}}, grad, in[0])
		if err != nil {
			return nil, err
		}
		return G.Nodes{dx, dc}, nil
	}
	return nil, fmt.Errorf("models: second derivatives of %v are not implemented: %w", op.kind, errors.ErrUnsupported)
}

// applyChan applies x (+ or *) c along axes [axis, axis+len(c.Shape())).
func applyChan(kind chanKind, x, c *G.Node, axis int) (*G.Node, error) {
	cs := c.Shape()
	n := len(cs)
	if x.Dtype() != c.Dtype() {
		return nil, fmt.Errorf("models: %v dtype mismatch: input %v, parameter %v: %w", kind, x.Dtype(), c.Dtype(), errs.InvalidArgument)
	}
	xs := x.Shape()
	if axis < 0 || axis+n > len(xs) {
		return nil, fmt.Errorf("models: %v: parameter of shape %v does not fit input %v at axis %d: %w", kind, cs, xs, axis, errs.InvalidArgument)
	}
	for i, d := range cs {
		if xs[axis+i] != d {
			return nil, fmt.Errorf("models: %v: parameter of shape %v does not fit input %v at axis %d: %w", kind, cs, xs, axis, errs.InvalidArgument)
		}
	}
	return G.ApplyOp(chanOp{kind: kind, axis: axis, n: n, inDims: len(xs), cShape: append([]int(nil), cs...)}, x, c)
}

func (op chanOp) scaleCell() *gradScale { return op.scale }
