package ddp

import (
	"fmt"
	"hash"
	"math"

	"github.com/chewxy/hm"
	G "gorgonia.org/gorgonia"
	"gorgonia.org/tensor"

	"github.com/tandemml/tandem/internal/opkit"
	"github.com/tandemml/tandem/models"
)

// The pieces of SyncBatchNorm as gorgonia ops, each with its exact gradient.
// x is [N, C, inner...]; "per channel" vectors are [C]; E1 is [C+1], the
// per-channel sums followed by the element count (summed over the ranks by
// the all-reduce between the ops). Statistics are accumulated in float64.
type sbnKind int

const (
	sbnStats         sbnKind = iota + 1 // x → [Σx per channel, count]
	sbnStatsGrad                        // (x, g[C+1]) → like x: g[c]
	sbnMean                             // E1 → S/N
	sbnMeanGrad                         // (E1, g) → [g/N, 0]
	sbnSqDev                            // (x, mean) → Σ(x-mean)² per channel
	sbnSqDevGradX                       // (x, mean, g) → 2(x-mean)·g
	sbnSqDevGradMean                    // (x, mean, g) → -2·g·Σ(x-mean)
	sbnVar                              // (Q, E1) → Q/N
	sbnVarGrad                          // (E1, g) → g/N
	sbnNorm                             // (x, mean, var[, w, b]) → (x-mean)/√(var+eps)·w + b
	sbnNormGradX                        // (x, mean, var, [w,] g) → g·w·r
	sbnNormGradMean                     // → -w·r·Σg
	sbnNormGradVar                      // → -½·w·r³·Σ g(x-mean)
	sbnNormGradW                        // → Σ g(x-mean)·r
	sbnNormGradB                        // → Σ g
	sbnRunning                          // (mean, var, E1) → [1]; updates the running statistics
)

var sbnNames = map[sbnKind]string{
	sbnStats: "stats", sbnStatsGrad: "stats_grad", sbnMean: "mean", sbnMeanGrad: "mean_grad",
	sbnSqDev: "sq_dev", sbnSqDevGradX: "sq_dev_grad_x", sbnSqDevGradMean: "sq_dev_grad_mean",
	sbnVar: "var", sbnVarGrad: "var_grad", sbnNorm: "norm", sbnNormGradX: "norm_grad_x",
	sbnNormGradMean: "norm_grad_mean", sbnNormGradVar: "norm_grad_var", sbnNormGradW: "norm_grad_w",
	sbnNormGradB: "norm_grad_b", sbnRunning: "running",
}

type sbnOp struct {
	opkit.Plain
	kind     sbnKind
	dims     int // of x
	c        int
	eps      float64
	momentum float64
	affine   bool
	layer    *models.BatchNorm2d
}

func (op sbnOp) String() string {
	return fmt.Sprintf("SyncBN.%s{c:%d,eps:%g,layer:%p}", sbnNames[op.kind], op.c, op.eps, op.layer)
}

// normArgs is the arity of the normalization: x, mean, var and, with an
// affine transform, weight and bias.
func (op sbnOp) normArgs() int {
	if op.affine {
		return 5
	}
	return 3
}

func (op sbnOp) Arity() int {
	switch op.kind {
	case sbnStats, sbnMean:
		return 1
	case sbnStatsGrad, sbnMeanGrad, sbnSqDev, sbnVar, sbnVarGrad:
		return 2
	case sbnSqDevGradX, sbnSqDevGradMean, sbnRunning:
		return 3
	case sbnNorm:
		return op.normArgs()
	case sbnNormGradB:
		return 2
	default: // the other norm gradients: x, mean, var, [w], g
		if op.affine {
			return 5
		}
		return 4
	}
}

func (op sbnOp) Type() hm.Type {
	a := hm.TypeVariable('a')
	x := G.TensorType{Dims: op.dims, Of: a}
	v := G.TensorType{Dims: 1, Of: a}
	ins := make([]hm.Type, 0, op.Arity()+1)
	var out hm.Type = v
	switch op.kind {
	case sbnStats:
		ins = append(ins, x)
	case sbnStatsGrad:
		ins, out = append(ins, x, v), x
	case sbnMean:
		ins = append(ins, v)
	case sbnMeanGrad, sbnVar, sbnVarGrad:
		ins = append(ins, v, v)
	case sbnSqDev:
		ins = append(ins, x, v)
	case sbnSqDevGradX:
		ins, out = append(ins, x, v, v), x
	case sbnSqDevGradMean:
		ins = append(ins, x, v, v)
	case sbnRunning:
		ins = append(ins, v, v, v)
	case sbnNorm:
		ins, out = append(ins, x, v, v), x
		if op.affine {
			ins = append(ins, v, v)
		}
	case sbnNormGradB:
		ins = append(ins, x, x)
	default:
		ins = append(ins, x, v, v)
		if op.affine {
			ins = append(ins, v)
		}
		ins = append(ins, x)
		if op.kind == sbnNormGradX {
			out = x
		}
	}
	return hm.NewFnType(append(ins, out)...)
}

func (op sbnOp) InferShape(in ...G.DimSizer) (tensor.Shape, error) {
	if err := opkit.CheckArity("ddp", op, len(in), op.Arity()); err != nil {
		return nil, err
	}
	switch op.kind {
	case sbnStats, sbnMeanGrad:
		return tensor.Shape{op.c + 1}, nil
	case sbnStatsGrad, sbnSqDevGradX, sbnNorm, sbnNormGradX:
		s, ok := in[0].(tensor.Shape)
		if !ok {
			return nil, fmt.Errorf("ddp: %v: input shape %v", op, in[0])
		}
		return s.Clone(), nil
	case sbnRunning:
		return tensor.Shape{1}, nil
	}
	return tensor.Shape{op.c}, nil
}

func (op sbnOp) DiffWRT(n int) []bool {
	out := make([]bool, n)
	switch op.kind {
	case sbnStats, sbnMean:
		out[0] = true
	case sbnSqDev:
		out[0], out[1] = true, true
	case sbnVar:
		out[0] = true // the count carries no gradient
	case sbnNorm:
		for i := range out {
			out[i] = true
		}
	}
	return out
}

func (op sbnOp) SymDiff(in G.Nodes, _, grad *G.Node) (G.Nodes, error) {
	apply := func(k sbnKind, args ...*G.Node) (*G.Node, error) {
		o := op
		o.kind = k
		return G.ApplyOp(o, args...)
	}
	switch op.kind {
	case sbnStats:
		dx, err := apply(sbnStatsGrad, in[0], grad)
		return G.Nodes{dx}, err
	case sbnMean:
		d, err := apply(sbnMeanGrad, in[0], grad)
		return G.Nodes{d}, err
	case sbnSqDev:
		dx, err := apply(sbnSqDevGradX, in[0], in[1], grad)
		if err != nil {
			return nil, err
		}
		dm, err := apply(sbnSqDevGradMean, in[0], in[1], grad)
		return G.Nodes{dx, dm}, err
	case sbnVar:
		dq, err := apply(sbnVarGrad, in[1], grad)
		return G.Nodes{dq, nil}, err
	case sbnNorm:
		args := G.Nodes{in[0], in[1], in[2]}
		if op.affine {
			args = append(args, in[3])
		}
		args = append(args, grad)
		out := make(G.Nodes, 0, len(in))
		for _, k := range []sbnKind{sbnNormGradX, sbnNormGradMean, sbnNormGradVar} {
			d, err := apply(k, args...)
			if err != nil {
				return nil, err
			}
			out = append(out, d)
		}
		if op.affine {
			dw, err := apply(sbnNormGradW, args...)
			if err != nil {
				return nil, err
			}
			db, err := apply(sbnNormGradB, in[0], grad)
			if err != nil {
				return nil, err
			}
			out = append(out, dw, db)
		}
		return out, nil
	}
	return nil, fmt.Errorf("ddp: %v has no gradient", op)
}

func (op sbnOp) WriteHash(h hash.Hash) { fmt.Fprint(h, op.String()) }
func (op sbnOp) Hashcode() uint32      { return opkit.Hash(op) }

func (op sbnOp) Do(in ...G.Value) (G.Value, error) {
	if err := opkit.CheckArity("ddp", op, len(in), op.Arity()); err != nil {
		return nil, err
	}
	ds := make([]*tensor.Dense, len(in))
	for i, v := range in {
		d, ok := v.(*tensor.Dense)
		if !ok {
			return nil, fmt.Errorf("ddp: %v: input %d is %T, not a tensor", op, i, v)
		}
		if d.RequiresIterator() {
			d = d.Materialize().(*tensor.Dense)
		}
		ds[i] = d
	}
	switch ds[0].Dtype() {
	case tensor.Float64:
		return sbnDo[float64](op, ds)
	case tensor.Float32:
		return sbnDo[float32](op, ds)
	}
	return nil, fmt.Errorf("ddp: %v: dtype %v; want float32 or float64", op, ds[0].Dtype())
}

// sbnLayout returns outer and inner of an [N, C, inner...] shape.
func (op sbnOp) layout(s tensor.Shape) (outer, inner int, err error) {
	if len(s) != op.dims || s[1] != op.c {
		return 0, 0, fmt.Errorf("ddp: %v: input shape %v; want %d dimensions with %d channels", op, s, op.dims, op.c)
	}
	inner = 1
	for _, d := range s[2:] {
		inner *= d
	}
	return s[0], inner, nil
}

func sbnDo[T float32 | float64](op sbnOp, in []*tensor.Dense) (G.Value, error) {
	data := func(i int) []T { return in[i].Data().([]T) }
	vec := func(n int) (*tensor.Dense, []T) {
		t := tensor.New(tensor.Of(in[0].Dtype()), tensor.WithShape(n))
		return t, t.Data().([]T)
	}
	like := func() (*tensor.Dense, []T) {
		t := tensor.New(tensor.Of(in[0].Dtype()), tensor.WithShape(in[0].Shape().Clone()...))
		return t, t.Data().([]T)
	}
	c := op.c
	// each calls fn(ch, k) for every element k of x in channel ch
	var outer, inner int
	if op.kind != sbnMean && op.kind != sbnMeanGrad && op.kind != sbnVar && op.kind != sbnVarGrad && op.kind != sbnRunning {
		var err error
		if outer, inner, err = op.layout(in[0].Shape()); err != nil {
			return nil, err
		}
	}
	each := func(fn func(ch, k int)) {
		for o := 0; o < outer; o++ {
			for ch := 0; ch < c; ch++ {
				base := (o*c + ch) * inner
				for i := 0; i < inner; i++ {
					fn(ch, base+i)
				}
			}
		}
	}
	count := func(e1 []T) float64 { return float64(e1[c]) }
	switch op.kind {
	case sbnStats:
		x := data(0)
		acc := make([]float64, c)
		each(func(ch, k int) { acc[ch] += float64(x[k]) })
		t, out := vec(c + 1)
		for ch, v := range acc {
			out[ch] = T(v)
		}
		out[c] = T(outer * inner)
		return t, nil
	case sbnStatsGrad:
		g := data(1)
		t, out := like()
		each(func(ch, k int) { out[k] = g[ch] })
		return t, nil
	case sbnMean:
		e1 := data(0)
		t, out := vec(c)
		n := count(e1)
		for ch := range out {
			out[ch] = T(float64(e1[ch]) / n)
		}
		return t, nil
	case sbnMeanGrad:
		e1, g := data(0), data(1)
		t, out := vec(c + 1)
		n := count(e1)
		for ch := 0; ch < c; ch++ {
			out[ch] = T(float64(g[ch]) / n)
		}
		return t, nil
	case sbnSqDev:
		x, m := data(0), data(1)
		acc := make([]float64, c)
		each(func(ch, k int) { d := float64(x[k]) - float64(m[ch]); acc[ch] += d * d })
		t, out := vec(c)
		for ch, v := range acc {
			out[ch] = T(v)
		}
		return t, nil
	case sbnSqDevGradX:
		x, m, g := data(0), data(1), data(2)
		t, out := like()
		each(func(ch, k int) { out[k] = T(2 * (float64(x[k]) - float64(m[ch])) * float64(g[ch])) })
		return t, nil
	case sbnSqDevGradMean:
		x, m, g := data(0), data(1), data(2)
		acc := make([]float64, c)
		each(func(ch, k int) { acc[ch] += float64(x[k]) - float64(m[ch]) })
		t, out := vec(c)
		for ch := range out {
			out[ch] = T(-2 * float64(g[ch]) * acc[ch])
		}
		return t, nil
	case sbnVar:
		q, e1 := data(0), data(1)
		t, out := vec(c)
		n := count(e1)
		for ch := range out {
			out[ch] = T(float64(q[ch]) / n)
		}
		return t, nil
	case sbnVarGrad:
		e1, g := data(0), data(1)
		t, out := vec(c)
		n := count(e1)
		for ch := range out {
			out[ch] = T(float64(g[ch]) / n)
		}
		return t, nil
	case sbnRunning:
		return op.updateRunning(data(0), data(1), count(data(2)))
	case sbnNormGradB:
		g := data(1)
		acc := make([]float64, c)
		each(func(ch, k int) { acc[ch] += float64(g[k]) })
		t, out := vec(c)
		for ch := range out {
			out[ch] = T(acc[ch])
		}
		return t, nil
	}
	// normalization and its gradients
	x, m, v := data(0), data(1), data(2)
	r := make([]float64, c)
	w := make([]float64, c)
	b := make([]float64, c)
	for ch := range r {
		r[ch] = 1 / math.Sqrt(float64(v[ch])+op.eps)
		w[ch] = 1
	}
	next := 3
	if op.affine {
		for ch, wv := range data(3) {
			w[ch] = float64(wv)
		}
		next = 4
		if op.kind == sbnNorm {
			for ch, bv := range data(4) {
				b[ch] = float64(bv)
			}
		}
	}
	switch op.kind {
	case sbnNorm:
		t, out := like()
		each(func(ch, k int) { out[k] = T((float64(x[k])-float64(m[ch]))*r[ch]*w[ch] + b[ch]) })
		return t, nil
	case sbnNormGradX:
		g := data(next)
		t, out := like()
		each(func(ch, k int) { out[k] = T(float64(g[k]) * w[ch] * r[ch]) })
		return t, nil
	}
	g := data(next)
	acc := make([]float64, c)
	switch op.kind {
	case sbnNormGradMean:
		each(func(ch, k int) { acc[ch] += float64(g[k]) })
		for ch := range acc {
			acc[ch] *= -w[ch] * r[ch]
		}
	case sbnNormGradVar:
		each(func(ch, k int) { acc[ch] += float64(g[k]) * (float64(x[k]) - float64(m[ch])) })
		for ch := range acc {
			acc[ch] *= -0.5 * w[ch] * r[ch] * r[ch] * r[ch]
		}
	case sbnNormGradW:
		each(func(ch, k int) { acc[ch] += float64(g[k]) * (float64(x[k]) - float64(m[ch])) })
		for ch := range acc {
			acc[ch] *= r[ch]
		}
	default:
		return nil, fmt.Errorf("ddp: unknown SyncBatchNorm op %d", op.kind)
	}
	t, out := vec(c)
	for ch := range out {
		out[ch] = T(acc[ch])
	}
	return t, nil
}

// updateRunning folds the global batch statistics into the layer's running
// ones (momentum rule, unbiased variance) and counts the batch.
func (op sbnOp) updateRunning(mean, variance any, n float64) (G.Value, error) {
	bn := op.layer
	mom := bn.Momentum
	unbias := n / math.Max(n-1, 1)
	switch rm := bn.RunningMean.Value.Data().(type) {
	case []float64:
		rv := bn.RunningVar.Value.Float64s()
		m, v := mean.([]float64), variance.([]float64)
		for ch := range rm {
			rm[ch] = (1-mom)*rm[ch] + mom*m[ch]
			rv[ch] = (1-mom)*rv[ch] + mom*v[ch]*unbias
		}
	case []float32:
		rv := bn.RunningVar.Value.Float32s()
		m, v := mean.([]float32), variance.([]float32)
		for ch := range rm {
			rm[ch] = float32((1-mom)*float64(rm[ch]) + mom*float64(m[ch]))
			rv[ch] = float32((1-mom)*float64(rv[ch]) + mom*float64(v[ch])*unbias)
		}
	default:
		return nil, fmt.Errorf("ddp: SyncBatchNorm running statistics of dtype %v", bn.RunningMean.Value.Dtype())
	}
	if bn.NumBatchesTracked != nil {
		if k, ok := bn.NumBatchesTracked.Value.Data().(int64); ok {
			bn.NumBatchesTracked.Value.Set(0, k+1)
		}
	}
	return tensor.New(tensor.Of(bn.RunningMean.Value.Dtype()), tensor.WithShape(1)), nil
}
