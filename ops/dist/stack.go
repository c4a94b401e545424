package dist

import (
	"fmt"
	"hash"

	"github.com/chewxy/hm"
	G "gorgonia.org/gorgonia"
	"gorgonia.org/tensor"

	"github.com/tandemml/tandem/internal/opkit"
)

// Stacked outputs.
//
// AllGather, Gather and AllToAll produce one value per rank with one
// collective: a stacked node of shape [world, block...]. The per-rank nodes
// the functions return are blocks of it, taken by a stackOp that takes block
// i; the gradient of a block is the stackOp that places it into zeros of the
// stacked shape. gorgonia adds up the placed gradients of all the blocks,
// and since every element of the stack receives exactly one nonzero term the
// sum is exact.
//
// These ops copy rather than return views, and always write their whole
// output: gorgonia's own slice gradient (sliceIncrOp) adds into the buffer an
// executor preallocates without clearing it, which is wrong when an
// executor reuses the buffer of the previous run.

// stackDir says which way a stackOp goes.
type stackDir uint8

const (
	takeBlock  stackDir = iota // stacked → block i
	placeBlock                 // block → zeros of the stacked shape, with the input as block i
)

// stackOp takes block i of a stacked tensor (takeBlock) or puts its input
// as block i into zeros of the stacked shape (placeBlock). Each direction is
// the gradient of the other.
type stackOp struct {
	opkit.Plain
	opkit.Unary // the input's and the output's types
	dir         stackDir
	i           int
	stacked     tensor.Shape // [w, block...]
	dt          tensor.Dtype
}

var (
	_ G.SDOp            = stackOp{}
	_ G.UsePreallocDoer = stackOp{}
)

// unstack returns the w blocks of a stacked node of shape [w, block...].
func unstack(stacked *G.Node, w int) (G.Nodes, error) {
	s := stacked.Shape()
	if len(s) == 0 || s[0] != w {
		return nil, fmt.Errorf("dist: cannot cut a node of shape %v into %d blocks: %w", s, w, ErrInvalidArgument)
	}
	out := make(G.Nodes, w)
	for i := range out {
		op := stackOp{
			Unary: opkit.Unary{In: stacked.Type(), Out: typeOf(s[1:], stacked.Dtype())},
			dir:   takeBlock, i: i, stacked: s.Clone(), dt: stacked.Dtype(),
		}
		n, err := G.ApplyOp(op, stacked)
		if err != nil {
			return nil, fmt.Errorf("dist: taking block %d of %v: %v: %w", i, s, err, ErrInvalidArgument)
		}
		out[i] = n
	}
	return out, nil
}

// typeOf is the gorgonia type of a node of the given shape and dtype.
func typeOf(s tensor.Shape, dt tensor.Dtype) hm.Type { return opkit.TypeOf(len(s), dt) }

func (op stackOp) String() string {
	if op.dir == placeBlock {
		return fmt.Sprintf("place(%d into %v)", op.i, op.stacked)
	}
	return fmt.Sprintf("block(%d of %v)", op.i, op.stacked)
}

// InferShape: one block, or the whole stack.
func (op stackOp) InferShape(...G.DimSizer) (tensor.Shape, error) {
	if op.dir == placeBlock {
		return op.stacked.Clone(), nil
	}
	return op.stacked[1:].Clone(), nil
}

func (op stackOp) WriteHash(h hash.Hash) {
	name := "block"
	if op.dir == placeBlock {
		name = "place"
	}
	fmt.Fprintf(h, "tandem/dist.%s|%d|%v|%v", name, op.i, op.stacked, op.dt)
}

func (op stackOp) Hashcode() uint32 { return opkit.Hash(op) }

// DiffWRT: taking and placing a block are linear.
func (op stackOp) DiffWRT(n int) []bool { return opkit.AllDiff(n) }

// SymDiff goes the other way: a block's gradient is placed into zeros of
// the stacked shape, a placed block's gradient is taken out of the stacked
// gradient.
func (op stackOp) SymDiff(inputs G.Nodes, _, grad *G.Node) (G.Nodes, error) {
	back := stackOp{Unary: opkit.Unary{In: grad.Type(), Out: op.In}, dir: placeBlock, i: op.i, stacked: op.stacked, dt: op.dt}
	if op.dir == placeBlock {
		back.dir = takeBlock
	}
	n, err := G.ApplyOp(back, grad)
	if err != nil {
		return nil, fmt.Errorf("dist: %v: gradient: %v: %w", op, err, ErrInvalidArgument)
	}
	return G.Nodes{n}, nil
}

func (op stackOp) Do(inputs ...G.Value) (G.Value, error) {
	return op.UsePreallocDo(nil, inputs...)
}

// UsePreallocDo copies block i out of its input, or writes zeros and its
// input at block i, into prealloc when it fits, else into a new buffer.
func (op stackOp) UsePreallocDo(prealloc G.Value, inputs ...G.Value) (G.Value, error) {
	if err := opkit.CheckArity("dist", op, len(inputs), 1); err != nil {
		return nil, err
	}
	src, dt, err := flatOf(inputs[0])
	if err != nil {
		return nil, fmt.Errorf("dist: %v: %v: %w", op, err, ErrInvalidArgument)
	}
	n := op.stacked[1:].TotalSize()
	want := n
	if op.dir == takeBlock {
		want = op.stacked[0] * n
	}
	if dt != op.dt || flatLen(src) != want {
		return nil, fmt.Errorf("dist: %v: input of dtype %v with %d elements: %w", op, dt, flatLen(src), ErrInvalidArgument)
	}
	if op.dir == takeBlock {
		out := reuse(prealloc, op.dt, n)
		copyFlat(out, 0, subFlat(src, op.i*n, (op.i+1)*n))
		return result(out, op.Out, op.stacked[1:]), nil
	}
	out := reuse(prealloc, op.dt, op.stacked.TotalSize())
	zeroFlat(out)
	copyFlat(out, op.i*n, src)
	return result(out, op.Out, op.stacked), nil
}
