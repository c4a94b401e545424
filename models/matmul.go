package models

import (
	"fmt"
	"hash"

	"github.com/chewxy/hm"
	"gonum.org/v1/gonum/blas"
	G "gorgonia.org/gorgonia"
	"gorgonia.org/tensor"

	tblas "github.com/tandemml/tandem/internal/blas"
	"github.com/tandemml/tandem/internal/errs"
	"github.com/tandemml/tandem/internal/opkit"
)

// matMulOp computes op(A)·op(B) for row-major matrices, where op transposes
// its operand when the matching flag is set. The transposes are handed to
// GEMM as flags, so no transposed copy is ever made; its gradients are again
// matMulOps with other flags (see SymDiff).
type matMulOp struct {
	opkit.Plain
	transA, transB bool
	need           *inputGrads // which operands need gradients (nil: both)
	scale          *gradScale  // multiplies a gradient product (see Builder.SetGradTarget)
}

// Transpose says which operands MatMulT transposes: TransA, TransB, both
// (TransA|TransB) or neither (0).
type Transpose uint8

const (
	// TransA transposes the first operand.
	TransA Transpose = 1 << iota
	// TransB transposes the second operand.
	TransB
)

// MatMulT returns op(a)·op(b) where op transposes the operands t names:
// MatMulT(x, w, TransB) is the product Linear uses (x·Wᵀ with W stored
// [out, in]). The transposes are GEMM flags, not copies; the product costs
// one GEMM forward and one per input gradient backward.
func MatMulT(a, b *G.Node, t Transpose) (*G.Node, error) {
	return matMulT(nil, a, b, t&TransA != 0, t&TransB != 0)
}

// matMulT is MatMulT for a layer built through bl (nil for none), whose
// Backward then skips the gradient of an operand that needs none.
func matMulT(bl *Builder, a, b *G.Node, transA, transB bool) (*G.Node, error) {
	if a.Dims() != 2 || b.Dims() != 2 {
		return nil, fmt.Errorf("models: MatMulT needs two matrices, got shapes %v and %v: %w", a.Shape(), b.Shape(), errs.InvalidArgument)
	}
	if a.Dtype() != b.Dtype() {
		return nil, fmt.Errorf("models: MatMulT dtype mismatch: %v and %v: %w", a.Dtype(), b.Dtype(), errs.InvalidArgument)
	}
	op := matMulOp{transA: transA, transB: transB, need: newInputGrads(bl, a, b)}
	if _, err := op.InferShape(a.Shape(), b.Shape()); err != nil {
		return nil, err
	}
	return G.ApplyOp(op, a, b)
}

func (op matMulOp) Arity() int { return 2 }

func (op matMulOp) Type() hm.Type {
	m := G.TensorType{Dims: 2, Of: hm.TypeVariable('a')}
	return hm.NewFnType(m, m, m)
}

func (op matMulOp) dims(a, b tensor.Shape) (m, k, n int, err error) {
	if len(a) != 2 || len(b) != 2 {
		return 0, 0, 0, fmt.Errorf("models: %v needs two matrices, got shapes %v and %v: %w", op, a, b, errs.InvalidArgument)
	}
	m, k = a[0], a[1]
	if op.transA {
		m, k = k, m
	}
	kb, n := b[0], b[1]
	if op.transB {
		kb, n = n, kb
	}
	if k != kb {
		return 0, 0, 0, fmt.Errorf("models: %v inner dimensions differ: shapes %v and %v: %w", op, a, b, errs.InvalidArgument)
	}
	return m, k, n, nil
}

func (op matMulOp) InferShape(in ...G.DimSizer) (tensor.Shape, error) {
	a, b, err := twoShapes(op, in)
	if err != nil {
		return nil, err
	}
	m, _, n, err := op.dims(a, b)
	if err != nil {
		return nil, err
	}
	return tensor.Shape{m, n}, nil
}

func (op matMulOp) Do(in ...G.Value) (G.Value, error) { return op.UsePreallocDo(nil, in...) }

// UsePreallocDo computes the product into prealloc when it fits (see
// outDense), else into a new tensor.
func (op matMulOp) UsePreallocDo(prealloc G.Value, in ...G.Value) (G.Value, error) {
	a, b, err := twoValues(op, in)
	if err != nil {
		return nil, err
	}
	if a.Dtype() != b.Dtype() {
		return nil, fmt.Errorf("models: %v dtype mismatch: %v and %v: %w", op, a.Dtype(), b.Dtype(), errs.InvalidArgument)
	}
	m, k, n, err := op.dims(a.Shape(), b.Shape())
	if err != nil {
		return nil, err
	}
	var out *tensor.Dense
	var beta float64
	if op.scale != nil && op.scale.add {
		// A fused update: the output is the parameter, which the product
		// adds into (see WithSGDInBackward).
		if out = reusable(prealloc, a.Dtype(), []int{m, n}, []G.Value{a, b}); out == nil {
			return nil, fmt.Errorf("models: %v adds into the parameter it updates, which must be a %v tensor of shape (%d, %d) that no input shares; got %v: %w",
				op, a.Dtype(), m, n, describe(prealloc), errs.InvalidArgument)
		}
		beta = 1
	} else {
		out = outDense(prealloc, a.Dtype(), []int{m, n}, a, b)
	}
	ta, tb := blas.NoTrans, blas.NoTrans
	if op.transA {
		ta = blas.Trans
	}
	if op.transB {
		tb = blas.Trans
	}
	lda, ldb := a.Shape()[1], b.Shape()[1]
	alpha := op.scale.factor()
	switch a.Dtype() {
	case tensor.Float64:
		tblas.Dgemm(ta, tb, m, n, k, alpha, a.Float64s(), lda, b.Float64s(), ldb, beta, out.Float64s(), n)
	case tensor.Float32:
		tblas.Sgemm(ta, tb, m, n, k, float32(alpha), a.Float32s(), lda, b.Float32s(), ldb, float32(beta), out.Float32s(), n)
	default:
		return nil, checkFloat(a.Dtype())
	}
	return out, nil
}

func (op matMulOp) WriteHash(h hash.Hash) { fmt.Fprint(h, op.String()) }
func (op matMulOp) Hashcode() uint32      { return opkit.HashString(op) }
func (op matMulOp) String() string {
	return fmt.Sprintf("MatMulT{a:%t,b:%t}", op.transA, op.transB)
}

func (op matMulOp) DiffWRT(int) []bool { return []bool{op.need.need(0), op.need.need(1)} }

// SymDiff: with C = A'·B' (A' = op(A), B' = op(B)) and upstream dC,
// dA' = dC·B'ᵀ and dB' = A'ᵀ·dC; undoing the transposes gives
//
//	dA = dC·op(B)ᵀ          (A not transposed)   dA = op(B)·dCᵀ   (A transposed)
//	dB = op(A)ᵀ·dC          (B not transposed)   dB = dCᵀ·op(A)   (B transposed)
//
// each a single GEMM with flags. An operand that needs no gradient (see
// gradScope) gets none.
func (op matMulOp) SymDiff(in G.Nodes, _, grad *G.Node) (G.Nodes, error) {
	if len(in) != 2 {
		return nil, fmt.Errorf("models: %v takes 2 inputs, got %d: %w", op, len(in), errs.InvalidArgument)
	}
	a, b := in[0], in[1]
	var da, db *G.Node
	var err error
	if op.need.need(0) {
		if !op.transA {
			da, err = G.ApplyOp(matMulOp{transA: false, transB: !op.transB, scale: &gradScale{}}, grad, b)
		} else {
			da, err = G.ApplyOp(matMulOp{transA: op.transB, transB: true, scale: &gradScale{}}, b, grad)
		}
		if err != nil {
			return nil, err
		}
	}
	if op.need.need(1) {
		if !op.transB {
			db, err = G.ApplyOp(matMulOp{transA: !op.transA, transB: false, scale: &gradScale{}}, a, grad)
		} else {
			db, err = G.ApplyOp(matMulOp{transA: true, transB: op.transA, scale: &gradScale{}}, grad, a)
		}
		if err != nil {
			return nil, err
		}
	}
	return G.Nodes{da, db}, nil
}

func (op matMulOp) scaleCell() *gradScale { return op.scale }
