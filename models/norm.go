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

// LayerNorm normalises over the trailing axes given by Shape, like PyTorch's
// nn.LayerNorm(normalized_shape, eps=1e-5): y = (x - mean)/√(var + eps)·weight
// + bias with the biased variance of each sample's trailing block; weight
// (ones) and bias (zeros) have shape Shape (absent without affine).
type LayerNorm struct {
	Shape        []int
	Eps          float64
	Weight, Bias *Param
}

// NewLayerNorm returns a LayerNorm over trailing axes of the given shape
// with eps 1e-5 and an elementwise affine transform. Options: WithDtype,
// WithEps, WithAffine.
func NewLayerNorm(shape []int, opts ...Option) (*LayerNorm, error) {
	if len(shape) == 0 {
		return nil, fmt.Errorf("models: LayerNorm needs a normalised shape: %w", errs.InvalidArgument)
	}
	for _, d := range shape {
		if d <= 0 {
			return nil, fmt.Errorf("models: LayerNorm shape %v must be positive: %w", shape, errs.InvalidArgument)
		}
	}
	c := newConfig(opts)
	if err := checkFloat(c.dtype); err != nil {
		return nil, fmt.Errorf("%w: %w", errs.InvalidArgument, err)
	}
	l := &LayerNorm{Shape: append([]int(nil), shape...), Eps: c.eps(1e-5)}
	if c.affine() {
		l.Weight = constParam("weight", c.dtype, true, 1, shape...)
		l.Bias = constParam("bias", c.dtype, true, 0, shape...)
	}
	return l, nil
}

// Params returns weight then bias (nothing without affine).
func (l *LayerNorm) Params() []*Param {
	if l.Weight == nil {
		return nil
	}
	return []*Param{l.Weight, l.Bias}
}

// Buffers returns nothing.
func (l *LayerNorm) Buffers() []*Param { return nil }

// Forward normalises x, whose trailing axes must equal Shape.
func (l *LayerNorm) Forward(b *Builder, x *G.Node) (*G.Node, error) {
	xs := x.Shape()
	k := len(l.Shape)
	if len(xs) < k || !tensor.Shape(xs[len(xs)-k:]).Eq(tensor.Shape(l.Shape)) {
		return nil, fmt.Errorf("models: LayerNorm%v got input of shape %v: %w", l.Shape, xs, errs.InvalidArgument)
	}
	if err := checkFloat(x.Dtype()); err != nil {
		return nil, err
	}
	d := tensor.Shape(l.Shape).TotalSize()
	y, err := G.ApplyOp(&normOp{kind: normLayer, eps: l.Eps, d: d, dims: len(xs)}, x)
	if err != nil {
		return nil, err
	}
	return affine(b, y, l.Weight, l.Bias, len(xs)-k)
}

// affine applies y·w + b along axes starting at axis, skipping nil params.
func affine(b *Builder, y *G.Node, w, bias *Param, axis int) (*G.Node, error) {
	if w != nil {
		wn, err := b.Node(w)
		if err != nil {
			return nil, err
		}
		if y, err = applyChan(chanMul, y, wn, axis); err != nil {
			return nil, err
		}
	}
	if bias != nil {
		bn, err := b.Node(bias)
		if err != nil {
			return nil, err
		}
		if y, err = applyChan(chanAdd, y, bn, axis); err != nil {
			return nil, err
		}
	}
	return y, nil
}

// BatchNorm2d is PyTorch's nn.BatchNorm2d(C, eps=1e-5, momentum=0.1) over
// NCHW inputs. Params: weight (ones), bias (zeros). Buffers: running_mean
// (zeros), running_var (ones), num_batches_tracked (int64 scalar 0).
//
// In Train mode each run normalises with the batch's per-channel mean and
// biased variance, and updates running_mean ← (1-m)·running_mean + m·mean,
// running_var ← (1-m)·running_var + m·unbiased variance, and increments
// num_batches_tracked, as PyTorch does. In Eval mode it normalises with the
// running statistics (read when the graph runs, so loads and broadcasts into
// them take effect).
type BatchNorm2d struct {
	C                 int
	Eps, Momentum     float64
	Weight, Bias      *Param
	RunningMean       *Param
	RunningVar        *Param
	NumBatchesTracked *Param
}

// NewBatchNorm2d returns a BatchNorm2d over c channels. Options: WithDtype,
// WithEps, WithMomentum, WithAffine.
func NewBatchNorm2d(c int, opts ...Option) (*BatchNorm2d, error) {
	if c <= 0 {
		return nil, fmt.Errorf("models: BatchNorm2d needs a positive channel count, got %d: %w", c, errs.InvalidArgument)
	}
	cfg := newConfig(opts)
	if err := checkFloat(cfg.dtype); err != nil {
		return nil, fmt.Errorf("%w: %w", errs.InvalidArgument, err)
	}
	bn := &BatchNorm2d{C: c, Eps: cfg.eps(1e-5), Momentum: 0.1}
	if cfg.momentum != nil {
		bn.Momentum = *cfg.momentum
	}
	if bn.Momentum < 0 || bn.Momentum > 1 {
		return nil, fmt.Errorf("models: BatchNorm2d momentum %v is outside [0, 1]: %w", bn.Momentum, errs.InvalidArgument)
	}
	if cfg.affine() {
		bn.Weight = constParam("weight", cfg.dtype, true, 1, c)
		bn.Bias = constParam("bias", cfg.dtype, true, 0, c)
	}
	bn.RunningMean = constParam("running_mean", cfg.dtype, false, 0, c)
	bn.RunningVar = constParam("running_var", cfg.dtype, false, 1, c)
	bn.NumBatchesTracked = &Param{Name: "num_batches_tracked", Value: tensor.New(tensor.WithShape(), tensor.WithBacking([]int64{0}))}
	return bn, nil
}

// Params returns weight then bias (nothing without affine).
func (l *BatchNorm2d) Params() []*Param {
	if l.Weight == nil {
		return nil
	}
	return []*Param{l.Weight, l.Bias}
}

// Buffers returns running_mean, running_var, num_batches_tracked.
func (l *BatchNorm2d) Buffers() []*Param {
	return []*Param{l.RunningMean, l.RunningVar, l.NumBatchesTracked}
}

// Forward normalises x of shape [N, C, H, W].
func (l *BatchNorm2d) Forward(b *Builder, x *G.Node) (*G.Node, error) {
	xs := x.Shape()
	if len(xs) != 4 || xs[1] != l.C {
		return nil, fmt.Errorf("models: BatchNorm2d(%d) needs input [N, %d, H, W], got %v: %w", l.C, l.C, xs, errs.InvalidArgument)
	}
	if x.Dtype() != l.RunningMean.Value.Dtype() {
		return nil, fmt.Errorf("models: BatchNorm2d of %v got input of %v: %w", l.RunningMean.Value.Dtype(), x.Dtype(), errs.InvalidArgument)
	}
	op := &normOp{kind: normBatchEval, eps: l.Eps, dims: 4, id: b.nextID(), bn: l}
	if b.Training() {
		op.kind = normBatchTrain
	}
	y, err := G.ApplyOp(op, x)
	if err != nil {
		return nil, err
	}
	return affine(b, y, l.Weight, l.Bias, 1)
}

type normKind int

const (
	normLayer      normKind = iota // per sample over the trailing d elements
	normBatchTrain                 // per channel over N·H·W, batch statistics
	normBatchEval                  // per channel, running statistics
)

// normOp produces the normalised x̂ (the affine part is separate chanOps);
// normGradOp (inputs x, dy) gives dx, recomputing the statistics from x:
// for batch statistics dx = (dy - mean(dy) - x̂·mean(dy·x̂))/σ over each
// group, for running statistics dx = dy/σ.
type normOp struct {
	opkit.Plain
	kind normKind
	eps  float64
	d    int // LayerNorm group size
	dims int
	id   int          // keeps BatchNorm ops apart in node hashing
	bn   *BatchNorm2d // running statistics (BatchNorm only)
}

type normGradOp struct{ *normOp }

func (op *normOp) Arity() int { return 1 }
func (op *normOp) Type() hm.Type {
	t := G.TensorType{Dims: op.dims, Of: hm.TypeVariable('a')}
	return hm.NewFnType(t, t)
}
func (op *normOp) InferShape(in ...G.DimSizer) (tensor.Shape, error) {
	if len(in) < 1 {
		return nil, fmt.Errorf("models: %v takes an input: %w", op, errs.InvalidArgument)
	}
	s, err := shapeOf(in[0])
	return s.Clone(), err
}

// groups returns how x's elements form normalisation groups: element
// (o, c, i) of the [outer, C, inner] view belongs to group c (batch norm) or
// o (layer norm, with C=1).
func (op *normOp) groups(s tensor.Shape) (outer, c, inner int) {
	if op.kind == normLayer {
		return s.TotalSize() / op.d, 1, op.d
	}
	return s[0], s[1], s[2] * s[3]
}

func (op *normOp) Do(in ...G.Value) (G.Value, error) {
	x, err := oneValue(op, in)
	if err != nil {
		return nil, err
	}
	out := newDense(x.Dtype(), x.Shape()...)
	switch x.Dtype() {
	case tensor.Float64:
		err = normForward(op, x.Shape(), x.Float64s(), out.Float64s())
	case tensor.Float32:
		err = normForward(op, x.Shape(), x.Float32s(), out.Float32s())
	default:
		err = checkFloat(x.Dtype())
	}
	if err != nil {
		return nil, err
	}
	return out, nil
}

// stats returns the mean and 1/σ of each group, and the group size.
func stats[T float](op *normOp, s tensor.Shape, x []T) (mean, rstd, variance []float64, n int, err error) {
	outer, c, inner := op.groups(s)
	if op.kind == normLayer {
		mean, rstd = make([]float64, outer), make([]float64, outer)
		for o := 0; o < outer; o++ {
			row := x[o*inner : (o+1)*inner]
			var m float64
			for _, v := range row {
				m += float64(v)
			}
			m /= float64(inner)
			var ss float64
			for _, v := range row {
				d := float64(v) - m
				ss += d * d
			}
			mean[o], rstd[o] = m, 1/math.Sqrt(ss/float64(inner)+op.eps)
		}
		return mean, rstd, nil, inner, nil
	}
	mean, rstd = make([]float64, c), make([]float64, c)
	n = outer * inner
	if op.kind == normBatchEval {
		rm, rv := toFloat64s(op.bn.RunningMean.Value), toFloat64s(op.bn.RunningVar.Value)
		if len(rm) != c || len(rv) != c {
			return nil, nil, nil, 0, fmt.Errorf("models: BatchNorm2d running statistics have %d and %d entries for %d channels: %w", len(rm), len(rv), c, errs.InvalidArgument)
		}
		for ch := range mean {
			mean[ch], rstd[ch] = rm[ch], 1/math.Sqrt(rv[ch]+op.eps)
		}
		return mean, rstd, nil, n, nil
	}
	if n < 2 {
		return nil, nil, nil, 0, fmt.Errorf("models: BatchNorm2d in training needs more than one value per channel, got input %v: %w", s, errs.InvalidArgument)
	}
	ss := make([]float64, c)
	for o := 0; o < outer; o++ {
		for ch := 0; ch < c; ch++ {
			for _, v := range x[(o*c+ch)*inner : (o*c+ch+1)*inner] {
				mean[ch] += float64(v)
			}
		}
	}
	for ch := range mean {
		mean[ch] /= float64(n)
	}
	for o := 0; o < outer; o++ {
		for ch := 0; ch < c; ch++ {
			for _, v := range x[(o*c+ch)*inner : (o*c+ch+1)*inner] {
				d := float64(v) - mean[ch]
				ss[ch] += d * d
			}
		}
	}
	for ch := range rstd {
		ss[ch] /= float64(n)
		rstd[ch] = 1 / math.Sqrt(ss[ch]+op.eps)
	}
	return mean, rstd, ss, n, nil
}

func toFloat64s(t *tensor.Dense) []float64 {
	switch d := t.Data().(type) {
	case []float64:
		return d
	case []float32:
		out := make([]float64, len(d))
		for i, v := range d {
			out[i] = float64(v)
		}
		return out
	}
	return nil
}

func normForward[T float](op *normOp, s tensor.Shape, x, out []T) error {
	mean, rstd, variance, n, err := stats(op, s, x)
	if err != nil {
		return err
	}
	outer, c, inner := op.groups(s)
	for o := 0; o < outer; o++ {
		for ch := 0; ch < c; ch++ {
			g := ch
			if op.kind == normLayer {
				g = o
			}
			base := (o*c + ch) * inner
			for i, v := range x[base : base+inner] {
				out[base+i] = T((float64(v) - mean[g]) * rstd[g])
			}
		}
	}
	if op.kind == normBatchTrain {
		op.updateRunning(mean, variance, n)
	}
	return nil
}

// updateRunning folds the batch statistics into the running ones with
// PyTorch's momentum rule and unbiased variance.
func (op *normOp) updateRunning(mean, variance []float64, n int) {
	m := op.bn.Momentum
	unbias := float64(n) / float64(n-1)
	for ch := range mean {
		v := variance[ch] * unbias
		switch rm := op.bn.RunningMean.Value.Data().(type) {
		case []float64:
			rv := op.bn.RunningVar.Value.Float64s()
			rm[ch] = (1-m)*rm[ch] + m*mean[ch]
			rv[ch] = (1-m)*rv[ch] + m*v
		case []float32:
			rv := op.bn.RunningVar.Value.Float32s()
			rm[ch] = float32((1-m)*float64(rm[ch]) + m*mean[ch])
			rv[ch] = float32((1-m)*float64(rv[ch]) + m*v)
		}
	}
	if k, ok := op.bn.NumBatchesTracked.Value.Data().(int64); ok {
		op.bn.NumBatchesTracked.Value.Set(0, k+1)
	}
}

func (op *normOp) WriteHash(h hash.Hash) { fmt.Fprint(h, op.String()) }
func (op *normOp) Hashcode() uint32      { return opkit.HashString(op) }
func (op *normOp) String() string {
	names := [...]string{"LayerNorm", "BatchNormTrain", "BatchNormEval"}
	return fmt.Sprintf("%s{eps:%v,d:%d,dims:%d,id:%d}", names[op.kind], op.eps, op.d, op.dims, op.id)
}
func (op *normOp) DiffWRT(int) []bool { return []bool{true} }
func (op *normOp) SymDiff(in G.Nodes, _, grad *G.Node) (G.Nodes, error) {
	dx, err := G.ApplyOp(normGradOp{op}, in[0], grad)
	if err != nil {
		return nil, err
	}
	return G.Nodes{dx}, nil
}

func (op normGradOp) Arity() int { return 2 }
func (op normGradOp) Type() hm.Type {
	t := G.TensorType{Dims: op.dims, Of: hm.TypeVariable('a')}
	return hm.NewFnType(t, t, t)
}
func (op normGradOp) Do(in ...G.Value) (G.Value, error) {
	x, dy, err := twoValues(op, in)
	if err != nil {
		return nil, err
	}
	if !dy.Shape().Eq(x.Shape()) || dy.Dtype() != x.Dtype() {
		return nil, fmt.Errorf("models: %v: gradient %v %v for input %v %v: %w", op, dy.Dtype(), dy.Shape(), x.Dtype(), x.Shape(), errs.InvalidArgument)
	}
	out := newDense(x.Dtype(), x.Shape()...)
	switch x.Dtype() {
	case tensor.Float64:
		err = normBackward(op.normOp, x.Shape(), x.Float64s(), dy.Float64s(), out.Float64s())
	case tensor.Float32:
		err = normBackward(op.normOp, x.Shape(), x.Float32s(), dy.Float32s(), out.Float32s())
	default:
		err = checkFloat(x.Dtype())
	}
	if err != nil {
		return nil, err
	}
	return out, nil
}

func normBackward[T float](op *normOp, s tensor.Shape, x, dy, out []T) error {
	mean, rstd, _, n, err := stats(op, s, x)
	if err != nil {
		return err
	}
	outer, c, inner := op.groups(s)
	group := func(o, ch int) int {
		if op.kind == normLayer {
			return o
		}
		return ch
	}
	if op.kind == normBatchEval {
		for o := 0; o < outer; o++ {
			for ch := 0; ch < c; ch++ {
				base := (o*c + ch) * inner
				r := rstd[ch]
				for i, g := range dy[base : base+inner] {
					out[base+i] = T(float64(g) * r)
				}
			}
		}
		return nil
	}
	ng := len(mean)
	sumDy, sumDyX := make([]float64, ng), make([]float64, ng)
	for o := 0; o < outer; o++ {
		for ch := 0; ch < c; ch++ {
			g := group(o, ch)
			base := (o*c + ch) * inner
			for i, d := range dy[base : base+inner] {
				xh := (float64(x[base+i]) - mean[g]) * rstd[g]
				sumDy[g] += float64(d)
				sumDyX[g] += float64(d) * xh
			}
		}
	}
	for o := 0; o < outer; o++ {
		for ch := 0; ch < c; ch++ {
			g := group(o, ch)
			base := (o*c + ch) * inner
			md, mdx := sumDy[g]/float64(n), sumDyX[g]/float64(n)
			for i, d := range dy[base : base+inner] {
				xh := (float64(x[base+i]) - mean[g]) * rstd[g]
				out[base+i] = T(rstd[g] * (float64(d) - md - xh*mdx))
			}
		}
	}
	return nil
}

func (op normGradOp) WriteHash(h hash.Hash) { fmt.Fprint(h, op.String()) }
func (op normGradOp) Hashcode() uint32      { return opkit.HashString(op) }
func (op normGradOp) String() string        { return "Grad" + op.normOp.String() }
func (op normGradOp) DiffWRT(int) []bool    { return []bool{false, false} }
func (op normGradOp) SymDiff(G.Nodes, *G.Node, *G.Node) (G.Nodes, error) {
	return nil, fmt.Errorf("models: second derivatives of normalisation are not implemented: %w", errors.ErrUnsupported)
}
