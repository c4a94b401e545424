package models

import (
	"fmt"
	"hash"
	"math/rand/v2"

	"github.com/chewxy/hm"
	G "gorgonia.org/gorgonia"
	"gorgonia.org/tensor"

	"github.com/tandemml/tandem/internal/errs"
	"github.com/tandemml/tandem/internal/opkit"
)

// Dropout zeroes each element with probability P during training and scales
// the survivors by 1/(1-P), like PyTorch's nn.Dropout; in Eval mode it is the
// identity. A fresh mask is drawn on every run of the graph, from a
// generator seeded at build time from the Builder's (WithBuilderRand).
type Dropout struct {
	P float64
}

// NewDropout returns a Dropout with drop probability p in [0, 1].
func NewDropout(p float64) (*Dropout, error) {
	if p < 0 || p > 1 || p != p {
		return nil, fmt.Errorf("models: dropout probability %v is outside [0, 1]: %w", p, errs.InvalidArgument)
	}
	return &Dropout{P: p}, nil
}

// Params returns nothing.
func (d *Dropout) Params() []*Param { return nil }

// Buffers returns nothing.
func (d *Dropout) Buffers() []*Param { return nil }

// Forward multiplies x by a random mask of 0 and 1/(1-P) in Train mode and
// returns x unchanged in Eval mode (or when P is 0).
func (d *Dropout) Forward(b *Builder, x *G.Node) (*G.Node, error) {
	if !b.Training() || d.P == 0 {
		return x, nil
	}
	if err := checkFloat(x.Dtype()); err != nil {
		return nil, err
	}
	mask, err := G.ApplyOp(&maskOp{p: d.P, id: b.nextID(), rng: b.newRand(), dims: x.Dims()}, x)
	if err != nil {
		return nil, err
	}
	return G.HadamardProd(x, mask)
}

// maskOp draws a dropout mask shaped like its input. It is not
// differentiated: the gradient flows through the product with the mask.
// id keeps two masks on the same input apart in gorgonia's node hashing.
type maskOp struct {
	opkit.Plain
	p    float64
	id   int
	dims int
	rng  *rand.Rand
}

func (op *maskOp) Arity() int { return 1 }
func (op *maskOp) Type() hm.Type {
	a := hm.TypeVariable('a')
	return hm.NewFnType(a, a)
}
func (op *maskOp) InferShape(in ...G.DimSizer) (tensor.Shape, error) {
	return firstShape(op, in, 1)
}
func (op *maskOp) Do(in ...G.Value) (G.Value, error) {
	x, err := oneValue(op, in)
	if err != nil {
		return nil, err
	}
	out := newDense(x.Dtype(), x.Shape()...)
	keep := 1 / (1 - op.p)
	switch d := out.Data().(type) {
	case []float64:
		for i := range d {
			if op.rng.Float64() >= op.p {
				d[i] = keep
			}
		}
	case []float32:
		for i := range d {
			if op.rng.Float64() >= op.p {
				d[i] = float32(keep)
			}
		}
	default:
		return nil, checkFloat(x.Dtype())
	}
	return out, nil
}
func (op *maskOp) WriteHash(h hash.Hash) { fmt.Fprint(h, op.String()) }
func (op *maskOp) Hashcode() uint32      { return opkit.HashString(op) }
func (op *maskOp) String() string        { return fmt.Sprintf("DropoutMask{p:%v,id:%d}", op.p, op.id) }
func (op *maskOp) DiffWRT(int) []bool    { return []bool{false} }
func (op *maskOp) SymDiff(G.Nodes, *G.Node, *G.Node) (G.Nodes, error) {
	return G.Nodes{nil}, nil
}
