package models

import (
	"errors"
	"fmt"
	"hash"
	"math"

	"github.com/chewxy/hm"
	G "gorgonia.org/gorgonia"
	"gorgonia.org/tensor"

	"github.com/tandemml/tandem/internal/errs"
	"github.com/tandemml/tandem/internal/opkit"
)

// MaxPool2d takes the maximum over kernel windows of an NCHW input, like
// PyTorch's nn.MaxPool2d(kernel, stride, padding) with dilation 1 and
// ceil_mode false: padding counts as -∞, the output is
// floor((H + 2·pad - kernel)/stride) + 1 high, a NaN in a window wins, and
// among equal maxima the first (row-major) gets the gradient.
//
// The backward pass recomputes each window's argmax (no state is kept
// between the passes); 2×2 windows with stride 2, the common case, have
// branch-free kernels. Pooling the output of a ReLU, its backward pass also
// applies the ReLU's derivative, and the ReLU's own pass is skipped.
type MaxPool2d struct {
	Kernel, Stride, Padding [2]int
}

// NewMaxPool2d returns a MaxPool2d with a square kernel; the stride
// defaults to the kernel (as in PyTorch). Use WithStride and WithPadding to
// change them, WithKernel for a rectangular kernel.
func NewMaxPool2d(kernel int, opts ...Option) (*MaxPool2d, error) {
	c := newConfig(opts)
	k := [2]int{kernel, kernel}
	if c.kernel != nil {
		k = *c.kernel
	}
	s := k
	if c.stride != nil {
		s = *c.stride
	}
	var p [2]int
	if c.padding != nil {
		p = *c.padding
	}
	m := &MaxPool2d{Kernel: k, Stride: s, Padding: p}
	for i := 0; i < 2; i++ {
		if k[i] <= 0 || s[i] <= 0 || p[i] < 0 || 2*p[i] > k[i] {
			return nil, fmt.Errorf("models: MaxPool2d kernel %v stride %v padding %v: kernel and stride must be positive and padding at most half the kernel: %w", k, s, p, errs.InvalidArgument)
		}
	}
	return m, nil
}

// Params returns nothing.
func (m *MaxPool2d) Params() []*Param { return nil }

// Buffers returns nothing.
func (m *MaxPool2d) Buffers() []*Param { return nil }

// Forward pools x of shape [N, C, H, W].
func (m *MaxPool2d) Forward(_ *Builder, x *G.Node) (*G.Node, error) {
	op := poolOp{k: m.Kernel, s: m.Stride, p: m.Padding}
	if err := checkFloat(x.Dtype()); err != nil {
		return nil, err
	}
	if _, err := op.InferShape(x.Shape()); err != nil {
		return nil, err
	}
	return G.ApplyOp(op, x)
}

type poolOp struct {
	opkit.Plain
	k, s, p [2]int
}

// poolGradOp is poolOp's gradient: inputs (x, dy), output dx. It recomputes
// each window's argmax from x, so it holds no state between the passes.
// With relu set, x is the output of a ReLU and the op also applies the
// ReLU's derivative (a window's gradient passes only when its maximum is
// positive), so that the ReLU's own gradient pass can be skipped (see
// maskedPoolGrad).
type poolGradOp struct {
	poolOp
	relu bool
}

func (op poolOp) outHW(h, w int) (int, int) {
	return (h+2*op.p[0]-op.k[0])/op.s[0] + 1, (w+2*op.p[1]-op.k[1])/op.s[1] + 1
}

func (op poolOp) Arity() int { return 1 }
func (op poolOp) Type() hm.Type {
	t := G.TensorType{Dims: 4, Of: hm.TypeVariable('a')}
	return hm.NewFnType(t, t)
}
func (op poolOp) InferShape(in ...G.DimSizer) (tensor.Shape, error) {
	if len(in) < 1 {
		return nil, fmt.Errorf("models: %v takes an input: %w", op, errs.InvalidArgument)
	}
	s, err := shapeOf(in[0])
	if err != nil {
		return nil, err
	}
	if len(s) != 4 {
		return nil, fmt.Errorf("models: MaxPool2d needs an NCHW input, got shape %v: %w", s, errs.InvalidArgument)
	}
	oh, ow := op.outHW(s[2], s[3])
	if s[2]+2*op.p[0] < op.k[0] || s[3]+2*op.p[1] < op.k[1] {
		return nil, fmt.Errorf("models: MaxPool2d kernel %v larger than padded input %v: %w", op.k, s, errs.InvalidArgument)
	}
	return tensor.Shape{s[0], s[1], oh, ow}, nil
}
func (op poolOp) Do(in ...G.Value) (G.Value, error) { return op.UsePreallocDo(nil, in...) }

// UsePreallocDo writes the maxima into prealloc when it fits (see outDense).
func (op poolOp) UsePreallocDo(prealloc G.Value, in ...G.Value) (G.Value, error) {
	x, err := oneValue(op, in)
	if err != nil {
		return nil, err
	}
	os, err := op.InferShape(x.Shape())
	if err != nil {
		return nil, err
	}
	out := outDense(prealloc, x.Dtype(), os, x)
	s := x.Shape()
	switch x.Dtype() {
	case tensor.Float64:
		poolKernel(op, s, x.Float64s(), out.Float64s(), nil, nil, false)
	case tensor.Float32:
		poolKernel(op, s, x.Float32s(), out.Float32s(), nil, nil, false)
	default:
		return nil, checkFloat(x.Dtype())
	}
	return out, nil
}

// pairs reports whether the windows are 2×2, stride 2, unpadded: the
// common case, which has its own branch-free kernels.
func (op poolOp) pairs() bool {
	return op.k == [2]int{2, 2} && op.s == [2]int{2, 2} && op.p == [2]int{}
}

// poolKernel writes the window maxima of x into out; when dy is given it
// instead writes into dx, for every element of x, the sum of dy over the
// windows whose argmax it is (0 for most).
// With relu set, a window whose maximum is not positive passes no gradient.
func poolKernel[T float](op poolOp, s tensor.Shape, x, out, dy, dx []T, relu bool) {
	if op.pairs() {
		if dy == nil {
			pool2Forward(s, x, out)
		} else {
			pool2Backward(s, x, dy, dx, relu)
		}
		return
	}
	poolGeneric(op, s, x, out, dy, dx, relu)
}

// poolGeneric is poolKernel for any window, stride and padding.
func poolGeneric[T float](op poolOp, s tensor.Shape, x, out, dy, dx []T, relu bool) {
	if dy != nil {
		clear(dx)
	}
	h, w := s[2], s[3]
	oh, ow := op.outHW(h, w)
	planes := s[0] * s[1]
	for pl := 0; pl < planes; pl++ {
		xp := x[pl*h*w : (pl+1)*h*w]
		for i := 0; i < oh; i++ {
			h0 := i*op.s[0] - op.p[0]
			h1 := min(h0+op.k[0], h)
			h0 = max(h0, 0)
			for j := 0; j < ow; j++ {
				w0 := j*op.s[1] - op.p[1]
				w1 := min(w0+op.k[1], w)
				w0 = max(w0, 0)
				best := T(math.Inf(-1))
				arg := -1
			window:
				for r := h0; r < h1; r++ {
					for c := w0; c < w1; c++ {
						v := xp[r*w+c]
						if v > best || arg < 0 {
							best, arg = v, r*w+c
						}
						if v != v { // NaN propagates, as in PyTorch
							best, arg = v, r*w+c
							break window
						}
					}
				}
				o := pl*oh*ow + i*ow + j
				switch {
				case dy == nil:
					out[o] = best
				case !relu || best > 0:
					dx[pl*h*w+arg] += dy[o]
				}
			}
		}
	}
}

// pool2Forward is poolKernel's forward pass for 2×2 windows with stride 2.
// The builtin max propagates NaN, as the general kernel does.
func pool2Forward[T float](s tensor.Shape, x, out []T) {
	h, w := s[2], s[3]
	oh, ow := h/2, w/2
	for pl := 0; pl < s[0]*s[1]; pl++ {
		xp := x[pl*h*w : (pl+1)*h*w]
		op := out[pl*oh*ow : (pl+1)*oh*ow]
		for i := 0; i < oh; i++ {
			r0 := xp[2*i*w : 2*i*w+2*ow]
			r1 := xp[(2*i+1)*w : (2*i+1)*w+2*ow]
			o := op[i*ow : (i+1)*ow]
			for j := range o {
				o[j] = max(max(r0[2*j], r0[2*j+1]), max(r1[2*j], r1[2*j+1]))
			}
		}
	}
}

// pool2Backward is poolKernel's backward pass for 2×2 windows with stride
// 2. Windows do not overlap, so each element of x gets either its window's
// gradient (when it is the window's first maximum, or its first NaN) or 0,
// and every element of dx is written (rows and columns past the last window
// get 0). Which of the four it is depends on the data at random, so the
// index is picked by a tournament of comparisons that compile to
// conditional moves rather than branches (which would mispredict about half
// the time); a window holding a NaN takes the exact general path.
func pool2Backward[T float](s tensor.Shape, x, dy, dx []T, relu bool) {
	h, w := s[2], s[3]
	oh, ow := h/2, w/2
	for pl := 0; pl < s[0]*s[1]; pl++ {
		xp := x[pl*h*w : (pl+1)*h*w]
		dp := dx[pl*h*w : (pl+1)*h*w]
		gp := dy[pl*oh*ow : (pl+1)*oh*ow]
		for i := 0; i < oh; i++ {
			g := gp[i*ow : (i+1)*ow]
			r0 := xp[2*i*w : 2*i*w+2*len(g)]
			r1 := xp[(2*i+1)*w : (2*i+1)*w+2*len(g)]
			d0 := dp[2*i*w : 2*i*w+2*len(g)]
			d1 := dp[(2*i+1)*w : (2*i+1)*w+2*len(g)]
			for j, gv := range g {
				a, b, c, d := r0[2*j], r0[2*j+1], r1[2*j], r1[2*j+1]
				// Strict comparisons keep the first of equal maxima.
				kab := 0
				if b > a {
					kab = 1
				}
				kcd := 2
				if d > c {
					kcd = 3
				}
				ab, cd := max(a, b), max(c, d) // NaN-propagating
				k := kab
				if cd > ab {
					k = kcd
				}
				if relu {
					pos := 0 // is the window's maximum positive?
					if ab > 0 {
						pos = 1
					}
					if cd > 0 {
						pos = 1
					}
					if pos == 0 {
						k = 4 // the ReLU passes nothing: drop it in a spare slot
					}
				}
				if ab != ab || cd != cd {
					k = firstNaN(a, b, c, d)
					if relu {
						k = 4 // the ReLU's derivative at NaN is 0
					}
				}
				var v [8]T
				v[k&7] = gv
				d0[2*j], d0[2*j+1], d1[2*j], d1[2*j+1] = v[0], v[1], v[2], v[3]
			}
			clear(dp[2*i*w+2*ow : (2*i+1)*w])
			clear(dp[(2*i+1)*w+2*ow : (2*i+2)*w])
		}
		clear(dp[2*oh*w:])
	}
}

// firstNaN returns the index of the first NaN among a, b, c, d (3 if none).
func firstNaN[T float](a, b, c, d T) int {
	switch {
	case a != a:
		return 0
	case b != b:
		return 1
	case c != c:
		return 2
	}
	return 3
}

func (op poolOp) WriteHash(h hash.Hash) { fmt.Fprint(h, op.String()) }
func (op poolOp) Hashcode() uint32      { return opkit.HashString(op) }
func (op poolOp) String() string {
	return fmt.Sprintf("MaxPool2d{k:%v,s:%v,p:%v}", op.k, op.s, op.p)
}
func (op poolOp) DiffWRT(int) []bool { return []bool{true} }
func (op poolOp) SymDiff(in G.Nodes, _, grad *G.Node) (G.Nodes, error) {
	dx, err := G.ApplyOp(poolGradOp{poolOp: op, relu: isReLUOutput(in[0])}, in[0], grad)
	if err != nil {
		return nil, err
	}
	return G.Nodes{dx}, nil
}

func (op poolGradOp) Arity() int { return 2 }
func (op poolGradOp) Type() hm.Type {
	t := G.TensorType{Dims: 4, Of: hm.TypeVariable('a')}
	return hm.NewFnType(t, t, t)
}
func (op poolGradOp) InferShape(in ...G.DimSizer) (tensor.Shape, error) {
	return firstShape(op, in, 2)
}
func (op poolGradOp) Do(in ...G.Value) (G.Value, error) { return op.UsePreallocDo(nil, in...) }

// UsePreallocDo writes dx into prealloc when it fits (see outDense).
func (op poolGradOp) UsePreallocDo(prealloc G.Value, in ...G.Value) (G.Value, error) {
	x, dy, err := twoValues(op, in)
	if err != nil {
		return nil, err
	}
	os, err := op.poolOp.InferShape(x.Shape())
	if err != nil {
		return nil, err
	}
	if !dy.Shape().Eq(os) || dy.Dtype() != x.Dtype() {
		return nil, fmt.Errorf("models: %v: gradient %v %v for output %v: %w", op, dy.Dtype(), dy.Shape(), os, errs.InvalidArgument)
	}
	dx := outDense(prealloc, x.Dtype(), x.Shape(), x, dy)
	switch x.Dtype() {
	case tensor.Float64:
		poolKernel(op.poolOp, x.Shape(), x.Float64s(), nil, dy.Float64s(), dx.Float64s(), op.relu)
	case tensor.Float32:
		poolKernel(op.poolOp, x.Shape(), x.Float32s(), nil, dy.Float32s(), dx.Float32s(), op.relu)
	default:
		return nil, checkFloat(x.Dtype())
	}
	return dx, nil
}
func (op poolGradOp) WriteHash(h hash.Hash) { fmt.Fprint(h, op.String()) }
func (op poolGradOp) Hashcode() uint32      { return opkit.HashString(op) }
func (op poolGradOp) String() string {
	if op.relu {
		return "GradReLU" + op.poolOp.String()
	}
	return "Grad" + op.poolOp.String()
}

func (op poolGradOp) DiffWRT(int) []bool { return []bool{false, false} }
func (op poolGradOp) SymDiff(G.Nodes, *G.Node, *G.Node) (G.Nodes, error) {
	return nil, fmt.Errorf("models: second derivatives of MaxPool2d are not implemented: %w", errors.ErrUnsupported)
}

// isReLUOutput reports whether n is computed by a ReLU (alone or fused
// with a bias).
func isReLUOutput(n *G.Node) bool {
	switch op := n.Op().(type) {
	case eltOp:
		return op.kind == eltReLU
	case chanOp:
		return op.kind == chanAddReLU
	}
	return false
}

// maskedPoolGrad reports whether grad, the gradient reaching the ReLU
// output out, is a pooling gradient that already applied the ReLU's
// derivative to it: then out's pool was its only consumer (several
// consumers get their gradients summed by another node), and the ReLU's
// backward pass is grad itself.
func maskedPoolGrad(grad, out *G.Node) bool {
	pg, ok := grad.Op().(poolGradOp)
	if !ok || !pg.relu || grad.Graph() == nil {
		return false
	}
	it := grad.Graph().From(grad.ID())
	if !it.Next() {
		return false
	}
	first, ok := it.Node().(*G.Node)
	return ok && first == out
}
