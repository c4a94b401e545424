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

// CrossEntropy returns the mean over the batch of the cross entropy between
// softmax(logits) and the targets, as PyTorch's F.cross_entropy with its
// defaults (reduction="mean", no weights, no label smoothing). logits is
// [N, C] of float32 or float64. target is either
//
//   - class indices: a vector [N] of int64, int or int32 (the efficient form:
//     no one-hot tensor is built), every label in [0, C); or
//   - class probabilities: [N, C] of the logits' dtype (one-hot rows give the
//     same loss as indices).
//
// The forward pass uses a stable log-sum-exp; the gradient is the exact
// (softmax(logits) - target)/N, computed in one fused pass.
func CrossEntropy(logits, target *G.Node) (*G.Node, error) {
	ls := logits.Shape()
	if len(ls) != 2 {
		return nil, fmt.Errorf("models: CrossEntropy needs logits [N, C], got shape %v: %w", ls, errs.InvalidArgument)
	}
	if err := checkFloat(logits.Dtype()); err != nil {
		return nil, err
	}
	ts := target.Shape()
	soft := false
	switch {
	case len(ts) == 1 && ts[0] == ls[0] && isIndexDtype(target.Dtype()):
	case len(ts) == 2 && ts.Eq(ls) && target.Dtype() == logits.Dtype():
		soft = true
	default:
		return nil, fmt.Errorf("models: CrossEntropy target must be class indices [%d] (int64, int or int32) or probabilities %v of %v; got %v of shape %v: %w",
			ls[0], ls, logits.Dtype(), target.Dtype(), ts, errs.InvalidArgument)
	}
	return G.ApplyOp(xentOp{soft: soft, tDims: len(ts), zType: logits.Dtype(), tType: target.Dtype()}, logits, target)
}

// MSE returns mean((pred - target)²) over all elements, as PyTorch's
// F.mse_loss with reduction="mean".
func MSE(pred, target *G.Node) (*G.Node, error) {
	if !pred.Shape().Eq(target.Shape()) || pred.Dtype() != target.Dtype() {
		return nil, fmt.Errorf("models: MSE needs equal shapes and dtypes, got %v %v and %v %v: %w",
			pred.Dtype(), pred.Shape(), target.Dtype(), target.Shape(), errs.InvalidArgument)
	}
	d, err := G.Sub(pred, target)
	if err != nil {
		return nil, err
	}
	sq, err := G.Square(d)
	if err != nil {
		return nil, err
	}
	return G.Mean(sq)
}

func isIndexDtype(dt tensor.Dtype) bool {
	return dt == tensor.Int64 || dt == tensor.Int || dt == tensor.Int32
}

// labels returns the class indices of t as ints.
func labels(t *tensor.Dense) ([]int, error) {
	switch d := t.Data().(type) {
	case []int64:
		out := make([]int, len(d))
		for i, v := range d {
			out[i] = int(v)
		}
		return out, nil
	case []int:
		return d, nil
	case []int32:
		out := make([]int, len(d))
		for i, v := range d {
			out[i] = int(v)
		}
		return out, nil
	}
	return nil, fmt.Errorf("models: class labels of dtype %v (want int64, int or int32): %w", t.Dtype(), errs.InvalidArgument)
}

// xentOp is mean cross entropy from logits (inputs: logits, target).
type xentOp struct {
	opkit.Plain
	soft  bool
	tDims int
	zType tensor.Dtype // dtype of the logits
	tType tensor.Dtype // dtype of the target
}

// xentGradOp is its gradient (inputs: logits, target, upstream scalar).
type xentGradOp struct{ xentOp }

func (op xentOp) Arity() int { return 2 }
func (op xentOp) Type() hm.Type {
	return hm.NewFnType(G.TensorType{Dims: 2, Of: op.zType}, G.TensorType{Dims: op.tDims, Of: op.tType}, op.zType)
}
func (op xentOp) InferShape(...G.DimSizer) (tensor.Shape, error) { return tensor.ScalarShape(), nil }
func (op xentOp) Do(in ...G.Value) (G.Value, error)              { return op.UsePreallocDo(nil, in...) }

// UsePreallocDo stores the loss in prealloc when it is a scalar of the
// logits' dtype.
func (op xentOp) UsePreallocDo(prealloc G.Value, in ...G.Value) (G.Value, error) {
	if len(in) != 2 {
		return nil, fmt.Errorf("models: cross entropy takes logits and target, got %d inputs: %w", len(in), errs.InvalidArgument)
	}
	z, t, lab, err := op.inputs(in[:2])
	if err != nil {
		return nil, err
	}
	n, c := z.Shape()[0], z.Shape()[1]
	var loss float64
	switch z.Dtype() {
	case tensor.Float64:
		loss, err = xentForward(z.Float64s(), floats[float64](t), lab, n, c)
	case tensor.Float32:
		loss, err = xentForward(z.Float32s(), floats[float32](t), lab, n, c)
	}
	if err != nil {
		return nil, err
	}
	switch p := prealloc.(type) {
	case *G.F64:
		if p != nil && z.Dtype() == tensor.Float64 {
			*p = G.F64(loss)
			return p, nil
		}
	case *G.F32:
		if p != nil && z.Dtype() == tensor.Float32 {
			*p = G.F32(float32(loss))
			return p, nil
		}
	}
	return scalarValue(z.Dtype(), loss)
}

// inputs checks and unpacks (logits, target).
func (op xentOp) inputs(in []G.Value) (z, t *tensor.Dense, lab []int, err error) {
	if len(in) != 2 {
		return nil, nil, nil, fmt.Errorf("models: cross entropy takes logits and target, got %d inputs: %w", len(in), errs.InvalidArgument)
	}
	if z, err = denseOf(in[0]); err != nil {
		return nil, nil, nil, err
	}
	if t, err = denseOf(in[1]); err != nil {
		return nil, nil, nil, err
	}
	if z.Dims() != 2 {
		return nil, nil, nil, fmt.Errorf("models: cross entropy logits must be [N, C], got %v: %w", z.Shape(), errs.InvalidArgument)
	}
	if err = checkFloat(z.Dtype()); err != nil {
		return nil, nil, nil, err
	}
	if op.soft {
		if !t.Shape().Eq(z.Shape()) || t.Dtype() != z.Dtype() {
			return nil, nil, nil, fmt.Errorf("models: cross entropy probabilities %v %v do not match logits %v %v: %w", t.Dtype(), t.Shape(), z.Dtype(), z.Shape(), errs.InvalidArgument)
		}
		return z, t, nil, nil
	}
	if t.Dims() != 1 || t.Shape()[0] != z.Shape()[0] {
		return nil, nil, nil, fmt.Errorf("models: cross entropy labels of shape %v for logits %v (want [%d]): %w", t.Shape(), z.Shape(), z.Shape()[0], errs.InvalidArgument)
	}
	if lab, err = labels(t); err != nil {
		return nil, nil, nil, err
	}
	return z, nil, lab, nil
}

// xentForward returns mean_i (lse(z_i) - Σ_c t_ic z_ic), with t one-hot at
// lab[i] when lab is given. Sums run in float64.
func xentForward[T float](z, t []T, lab []int, n, c int) (float64, error) {
	var total float64
	for i := 0; i < n; i++ {
		row := z[i*c : (i+1)*c]
		lse := logSumExp(row)
		if lab != nil {
			k := lab[i]
			if k < 0 || k >= c {
				return 0, fmt.Errorf("models: cross entropy label %d of sample %d is outside [0, %d): %w", k, i, c, errs.InvalidArgument)
			}
			total += lse - float64(row[k])
			continue
		}
		trow := t[i*c : (i+1)*c]
		for j, v := range row {
			total += float64(trow[j]) * (lse - float64(v))
		}
	}
	return total / float64(n), nil
}

func logSumExp[T float](row []T) float64 {
	m := math.Inf(-1)
	for _, v := range row {
		m = math.Max(m, float64(v))
	}
	if math.IsInf(m, 0) {
		return m
	}
	var s float64
	for _, v := range row {
		s += math.Exp(float64(v) - m)
	}
	return m + math.Log(s)
}

func (op xentOp) WriteHash(h hash.Hash) { fmt.Fprint(h, op.String()) }
func (op xentOp) Hashcode() uint32      { return opkit.HashString(op) }
func (op xentOp) String() string {
	return fmt.Sprintf("CrossEntropy{soft:%t,%v,%v}", op.soft, op.zType, op.tType)
}
func (op xentOp) DiffWRT(int) []bool { return []bool{true, false} }
func (op xentOp) SymDiff(in G.Nodes, _, grad *G.Node) (G.Nodes, error) {
	if len(in) != 2 {
		return nil, fmt.Errorf("models: cross entropy takes 2 inputs, got %d: %w", len(in), errs.InvalidArgument)
	}
	dz, err := G.ApplyOp(xentGradOp{op}, in[0], in[1], grad)
	if err != nil {
		return nil, err
	}
	return G.Nodes{dz, nil}, nil
}

func (op xentGradOp) Arity() int { return 3 }
func (op xentGradOp) Type() hm.Type {
	m := G.TensorType{Dims: 2, Of: op.zType}
	return hm.NewFnType(m, G.TensorType{Dims: op.tDims, Of: op.tType}, op.zType, m)
}
func (op xentGradOp) InferShape(in ...G.DimSizer) (tensor.Shape, error) {
	return firstShape(op, in, 3)
}
func (op xentGradOp) Do(in ...G.Value) (G.Value, error) { return op.UsePreallocDo(nil, in...) }

// UsePreallocDo writes the gradient into prealloc when it fits (see outDense).
func (op xentGradOp) UsePreallocDo(prealloc G.Value, in ...G.Value) (G.Value, error) {
	if len(in) != 3 {
		return nil, fmt.Errorf("models: %v takes 3 inputs, got %d: %w", op, len(in), errs.InvalidArgument)
	}
	z, t, lab, err := op.inputs(in[:2])
	if err != nil {
		return nil, err
	}
	g, err := scalarOf(in[2])
	if err != nil {
		return nil, err
	}
	n, c := z.Shape()[0], z.Shape()[1]
	out := outDense(prealloc, z.Dtype(), []int{n, c}, in...)
	switch z.Dtype() {
	case tensor.Float64:
		err = xentBackward(out.Float64s(), z.Float64s(), floats[float64](t), lab, n, c, g)
	case tensor.Float32:
		err = xentBackward(out.Float32s(), z.Float32s(), floats[float32](t), lab, n, c, g)
	}
	if err != nil {
		return nil, err
	}
	return out, nil
}

// xentBackward writes g/N · (Σ_c t_ic · softmax(z_i) - t_i).
func xentBackward[T float](out, z, t []T, lab []int, n, c int, g float64) error {
	scale := g / float64(n)
	for i := 0; i < n; i++ {
		row := z[i*c : (i+1)*c]
		dst := out[i*c : (i+1)*c]
		lse := logSumExp(row)
		mass := 1.0
		if lab == nil {
			mass = 0
			for _, v := range t[i*c : (i+1)*c] {
				mass += float64(v)
			}
		}
		for j, v := range row {
			d := mass * math.Exp(float64(v)-lse)
			if lab == nil {
				d -= float64(t[i*c+j])
			}
			dst[j] = T(scale * d)
		}
		if lab != nil {
			k := lab[i]
			if k < 0 || k >= c {
				return fmt.Errorf("models: cross entropy label %d of sample %d is outside [0, %d): %w", k, i, c, errs.InvalidArgument)
			}
			dst[k] = T(scale * (math.Exp(float64(row[k])-lse) - 1))
		}
	}
	return nil
}

func (op xentGradOp) String() string {
	return fmt.Sprintf("CrossEntropyGrad{soft:%t,%v,%v}", op.soft, op.zType, op.tType)
}
func (op xentGradOp) WriteHash(h hash.Hash) { fmt.Fprint(h, op.String()) }
func (op xentGradOp) Hashcode() uint32      { return opkit.HashString(op) }
func (op xentGradOp) DiffWRT(int) []bool    { return []bool{false, false, false} }
func (op xentGradOp) SymDiff(G.Nodes, *G.Node, *G.Node) (G.Nodes, error) {
	return nil, fmt.Errorf("models: second derivatives of cross entropy are not implemented: %w", errors.ErrUnsupported)
}
