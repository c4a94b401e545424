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
	"github.com/tandemml/tandem/internal/vec"
)

// eltKind names an elementwise function with a hand-written derivative.
type eltKind int

const (
	eltReLU eltKind = iota
	eltGELU
)

func (k eltKind) String() string {
	switch k {
	case eltReLU:
		return "ReLU"
	case eltGELU:
		return "GELU"
	}
	return fmt.Sprintf("elt(%d)", int(k))
}

// eltOp applies an elementwise function; its gradient is an eltGradOp
// taking (x, dy). Both compute in one pass without temporaries.
type eltOp struct {
	opkit.Plain
	kind eltKind
}

// eltGradOp computes dx = dy · f'(x) for eltOp's function.
type eltGradOp struct {
	opkit.Plain
	kind eltKind
}

func (op eltOp) Arity() int { return 1 }
func (op eltOp) Type() hm.Type {
	a := hm.TypeVariable('a')
	return hm.NewFnType(a, a)
}
func (op eltOp) InferShape(in ...G.DimSizer) (tensor.Shape, error) {
	return firstShape(op, in, 1)
}
func (op eltOp) Do(in ...G.Value) (G.Value, error) { return op.UsePreallocDo(nil, in...) }

// UsePreallocDo writes f(x) into prealloc when it fits (see outDense).
func (op eltOp) UsePreallocDo(prealloc G.Value, in ...G.Value) (G.Value, error) {
	x, err := oneValue(op, in)
	if err != nil {
		return nil, err
	}
	out := outDense(prealloc, x.Dtype(), x.Shape(), x)
	switch x.Dtype() {
	case tensor.Float64:
		eltForward(op.kind, out.Float64s(), x.Float64s())
	case tensor.Float32:
		eltForward(op.kind, out.Float32s(), x.Float32s())
	default:
		return nil, checkFloat(x.Dtype())
	}
	return out, nil
}
func (op eltOp) WriteHash(h hash.Hash) { fmt.Fprint(h, op.String()) }
func (op eltOp) Hashcode() uint32      { return opkit.HashString(op) }
func (op eltOp) String() string        { return op.kind.String() }
func (op eltOp) DiffWRT(int) []bool    { return []bool{true} }
func (op eltOp) SymDiff(in G.Nodes, out, grad *G.Node) (G.Nodes, error) {
	if len(in) != 1 {
		return nil, fmt.Errorf("models: %v takes 1 input, got %d: %w", op, len(in), errs.InvalidArgument)
	}
	if op.kind == eltReLU && maskedPoolGrad(grad, out) {
		return G.Nodes{grad}, nil
	}
	dx, err := G.ApplyOp(eltGradOp(op), in[0], grad)
	if err != nil {
		return nil, err
	}
	return G.Nodes{dx}, nil
}

func (op eltGradOp) Arity() int { return 2 }
func (op eltGradOp) Type() hm.Type {
	a := hm.TypeVariable('a')
	return hm.NewFnType(a, a, a)
}
func (op eltGradOp) InferShape(in ...G.DimSizer) (tensor.Shape, error) {
	return firstShape(op, in, 2)
}
func (op eltGradOp) Do(in ...G.Value) (G.Value, error) { return op.UsePreallocDo(nil, in...) }

// UsePreallocDo writes dy·f'(x) into prealloc when it fits (see outDense).
func (op eltGradOp) UsePreallocDo(prealloc G.Value, in ...G.Value) (G.Value, error) {
	x, dy, err := twoValues(op, in)
	if err != nil {
		return nil, err
	}
	if x.Dtype() != dy.Dtype() || x.Size() != dy.Size() {
		return nil, fmt.Errorf("models: %v: input %v %v and gradient %v %v differ: %w", op, x.Dtype(), x.Shape(), dy.Dtype(), dy.Shape(), errs.InvalidArgument)
	}
	out := outDense(prealloc, x.Dtype(), x.Shape(), x, dy)
	switch x.Dtype() {
	case tensor.Float64:
		eltBackward(op.kind, out.Float64s(), x.Float64s(), dy.Float64s())
	case tensor.Float32:
		eltBackward(op.kind, out.Float32s(), x.Float32s(), dy.Float32s())
	default:
		return nil, checkFloat(x.Dtype())
	}
	return out, nil
}
func (op eltGradOp) WriteHash(h hash.Hash) { fmt.Fprint(h, op.String()) }
func (op eltGradOp) Hashcode() uint32      { return opkit.HashString(op) }
func (op eltGradOp) String() string        { return op.kind.String() + "Grad" }
func (op eltGradOp) DiffWRT(int) []bool    { return []bool{false, false} }
func (op eltGradOp) SymDiff(G.Nodes, *G.Node, *G.Node) (G.Nodes, error) {
	return nil, fmt.Errorf("models: second derivatives of %v are not implemented: %w", op.kind, errors.ErrUnsupported)
}

const invSqrt2 = 0.7071067811865476   // 1/√2
const invSqrt2Pi = 0.3989422804014327 // 1/√(2π)

func eltForward[T float](k eltKind, out, x []T) {
	switch k {
	case eltReLU:
		// max compiles to branch-free code (random signs defeat a branch
		// predictor); like PyTorch's relu it maps NaN to NaN.
		out = out[:len(x)]
		for i, v := range x {
			out[i] = max(v, 0)
		}
	case eltGELU:
		// exact GELU, x·Φ(x), PyTorch's default (approximate="none").
		for i, v := range x {
			f := float64(v)
			out[i] = T(0.5 * f * (1 + math.Erf(f*invSqrt2)))
		}
	}
}

func eltBackward[T float](k eltKind, out, x, dy []T) {
	switch k {
	case eltReLU:
		// PyTorch's threshold backward: the derivative at 0 (and at NaN) is 0.
		reluBackward(out, x, dy)
	case eltGELU:
		// d/dx x·Φ(x) = Φ(x) + x·φ(x)
		for i, v := range x {
			f := float64(v)
			cdf := 0.5 * (1 + math.Erf(f*invSqrt2))
			pdf := invSqrt2Pi * math.Exp(-0.5*f*f)
			out[i] = T(float64(dy[i]) * (cdf + f*pdf))
		}
	}
}

// reluBackward writes dy where x > 0 and 0 elsewhere. The selection is a
// bit mask on the gradient's bits, branch-free: a branch on the sign of
// activations mispredicts half the time and costs several times the memory
// traffic. Float32 runs in package vec's kernel, eight elements an
// instruction.
func reluBackward[T float](out, x, dy []T) {
	switch o := any(out).(type) {
	case []float32:
		reluBackward32(o, any(x).([]float32), any(dy).([]float32))
	case []float64:
		reluBackward64(o, any(x).([]float64), any(dy).([]float64))
	default:
		for i, v := range x {
			if v > 0 {
				out[i] = dy[i]
			} else {
				out[i] = 0
			}
		}
	}
}

func reluBackward32(out, x, dy []float32) { vec.ReLUMask(out, x, dy) }

func reluBackward64(out, x, dy []float64) {
	out, dy = out[:len(x)], dy[:len(x)]
	for i, v := range x {
		var m uint64
		if v > 0 {
			m = ^uint64(0)
		}
		out[i] = math.Float64frombits(math.Float64bits(dy[i]) & m)
	}
}
