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
)

// Embedding is a lookup table, PyTorch's nn.Embedding without padding_idx
// or max_norm: Weight is [Num, Dim] drawn from N(0, 1), and indices of shape
// S (int64, int or int32) map to rows, giving shape S + [Dim]. The gradient
// of Weight adds each output row's gradient into the row it came from.
type Embedding struct {
	Num, Dim int
	Weight   *Param
}

// NewEmbedding returns an Embedding of num rows of dim features. Options:
// WithDtype, WithRand.
func NewEmbedding(num, dim int, opts ...Option) (*Embedding, error) {
	if num <= 0 || dim <= 0 {
		return nil, fmt.Errorf("models: Embedding needs positive sizes, got num=%d dim=%d: %w", num, dim, errs.InvalidArgument)
	}
	c := newConfig(opts)
	if err := checkFloat(c.dtype); err != nil {
		return nil, fmt.Errorf("%w: %w", errs.InvalidArgument, err)
	}
	return &Embedding{Num: num, Dim: dim, Weight: normalParam("weight", c.dtype, c.rng, num, dim)}, nil
}

// Params returns the weight.
func (e *Embedding) Params() []*Param { return []*Param{e.Weight} }

// Buffers returns nothing.
func (e *Embedding) Buffers() []*Param { return nil }

// Forward looks up the rows named by idx. An index outside [0, Num) is an
// error when the graph runs.
func (e *Embedding) Forward(b *Builder, idx *G.Node) (*G.Node, error) {
	if !isIndexDtype(idx.Dtype()) {
		return nil, fmt.Errorf("models: Embedding indices must be int64, int or int32, got %v: %w", idx.Dtype(), errs.InvalidArgument)
	}
	w, err := b.Node(e.Weight)
	if err != nil {
		return nil, err
	}
	op := embedOp{num: e.Num, dim: e.Dim, idxDims: idx.Dims(), wType: e.Weight.Value.Dtype(), iType: idx.Dtype()}
	return G.ApplyOp(op, w, idx)
}

// embedOp gathers rows (inputs: weight, indices).
type embedOp struct {
	opkit.Plain
	num, dim     int
	idxDims      int
	wType, iType tensor.Dtype
}

// embedGradOp scatters gradients into rows (inputs: indices, dy).
type embedGradOp struct{ embedOp }

func (op embedOp) Arity() int { return 2 }
func (op embedOp) Type() hm.Type {
	return hm.NewFnType(G.TensorType{Dims: 2, Of: op.wType}, op.idxType(), op.outType())
}
func (op embedOp) idxType() hm.Type {
	if op.idxDims == 0 {
		return op.iType
	}
	return G.TensorType{Dims: op.idxDims, Of: op.iType}
}
func (op embedOp) outType() hm.Type { return G.TensorType{Dims: op.idxDims + 1, Of: op.wType} }
func (op embedOp) InferShape(in ...G.DimSizer) (tensor.Shape, error) {
	if len(in) != 2 {
		return nil, fmt.Errorf("models: %v takes 2 inputs, got %d: %w", op, len(in), errs.InvalidArgument)
	}
	s, err := shapeOf(in[1])
	if err != nil {
		return nil, err
	}
	return append(s.Clone(), op.dim), nil
}
func (op embedOp) Do(in ...G.Value) (G.Value, error) {
	w, it, err := twoValues(op, in)
	if err != nil {
		return nil, err
	}
	idx, err := op.indices(it)
	if err != nil {
		return nil, err
	}
	out := newDense(w.Dtype(), append(it.Shape().Clone(), op.dim)...)
	switch w.Dtype() {
	case tensor.Float64:
		gather(out.Float64s(), w.Float64s(), idx, op.dim)
	case tensor.Float32:
		gather(out.Float32s(), w.Float32s(), idx, op.dim)
	default:
		return nil, checkFloat(w.Dtype())
	}
	return out, nil
}

func (op embedOp) indices(t *tensor.Dense) ([]int, error) {
	var idx []int
	var err error
	if t.IsScalar() {
		v, ok := t.Data().(int64)
		if !ok {
			if vi, ok2 := t.Data().(int); ok2 {
				v, ok = int64(vi), true
			}
		}
		if !ok {
			return nil, fmt.Errorf("models: embedding index of dtype %v: %w", t.Dtype(), errs.InvalidArgument)
		}
		idx = []int{int(v)}
	} else if idx, err = labels(t); err != nil {
		return nil, err
	}
	for i, k := range idx {
		if k < 0 || k >= op.num {
			return nil, fmt.Errorf("models: embedding index %d at position %d is outside [0, %d): %w", k, i, op.num, errs.InvalidArgument)
		}
	}
	return idx, nil
}

func gather[T float](out, w []T, idx []int, dim int) {
	for i, k := range idx {
		copy(out[i*dim:(i+1)*dim], w[k*dim:(k+1)*dim])
	}
}

func (op embedOp) WriteHash(h hash.Hash) { fmt.Fprint(h, op.String()) }
func (op embedOp) Hashcode() uint32      { return opkit.HashString(op) }
func (op embedOp) String() string {
	return fmt.Sprintf("Embedding{%d,%d,%v,%v}", op.num, op.dim, op.wType, op.iType)
}
func (op embedOp) DiffWRT(int) []bool { return []bool{true, false} }
func (op embedOp) SymDiff(in G.Nodes, _, grad *G.Node) (G.Nodes, error) {
	dw, err := G.ApplyOp(embedGradOp{op}, in[1], grad)
	if err != nil {
		return nil, err
	}
	return G.Nodes{dw, nil}, nil
}

func (op embedGradOp) Type() hm.Type {
	return hm.NewFnType(op.idxType(), op.outType(), G.TensorType{Dims: 2, Of: op.wType})
}
func (op embedGradOp) InferShape(...G.DimSizer) (tensor.Shape, error) {
	return tensor.Shape{op.num, op.dim}, nil
}
func (op embedGradOp) Do(in ...G.Value) (G.Value, error) {
	it, dy, err := twoValues(op, in)
	if err != nil {
		return nil, err
	}
	idx, err := op.indices(it)
	if err != nil {
		return nil, err
	}
	out := newDense(dy.Dtype(), op.num, op.dim)
	switch dy.Dtype() {
	case tensor.Float64:
		scatterAdd(out.Float64s(), dy.Float64s(), idx, op.dim)
	case tensor.Float32:
		scatterAdd(out.Float32s(), dy.Float32s(), idx, op.dim)
	default:
		return nil, checkFloat(dy.Dtype())
	}
	return out, nil
}

func scatterAdd[T float](out, dy []T, idx []int, dim int) {
	for i, k := range idx {
		row := out[k*dim : (k+1)*dim]
		for j, v := range dy[i*dim : (i+1)*dim] {
			row[j] += v
		}
	}
}

func (op embedGradOp) WriteHash(h hash.Hash) { fmt.Fprint(h, op.String()) }
func (op embedGradOp) Hashcode() uint32      { return opkit.HashString(op) }
func (op embedGradOp) String() string        { return "Grad" + op.embedOp.String() }
func (op embedGradOp) DiffWRT(int) []bool    { return []bool{false, false} }
func (op embedGradOp) SymDiff(G.Nodes, *G.Node, *G.Node) (G.Nodes, error) {
	return nil, fmt.Errorf("models: second derivatives of Embedding are not implemented: %w", errors.ErrUnsupported)
}
