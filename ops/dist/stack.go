package dist

import (
	"fmt"
	"hash"
	"hash/fnv"

	"github.com/chewxy/hm"
	G "gorgonia.org/gorgonia"
	"gorgonia.org/tensor"
)

// Stacked outputs.
//
// AllGather, Gather and AllToAll produce one value per rank with one
// collective: a stacked node of shape [world, block...]. The per-rank nodes
// the functions return are blocks of it, taken by blockOp; the gradient of a
// block is placeOp, which puts it into zeros of the stacked shape. gorgonia
// adds up the placed gradients of all the blocks, and since every element of
// the stack receives exactly one nonzero term the sum is exact.
//
// These two ops copy rather than return views, and always write their whole
// output: gorgonia's own slice gradient (sliceIncrOp) adds into the buffer an
// executor preallocates without clearing it, which is wrong when an
// executor reuses the buffer of the previous run.

// blockOp returns block i of a stacked tensor.
type blockOp struct {
	i       int
	stacked tensor.Shape // [w, block...]
	dt      tensor.Dtype
	inType  hm.Type
	outType hm.Type
}

// placeOp returns zeros of the stacked shape with its input as block i.
type placeOp struct {
	i       int
	stacked tensor.Shape
	dt      tensor.Dtype
	inType  hm.Type
	outType hm.Type
}

var (
	_ G.SDOp            = blockOp{}
	_ G.UsePreallocDoer = blockOp{}
	_ G.SDOp            = placeOp{}
	_ G.UsePreallocDoer = placeOp{}
)

// unstack returns the w blocks of a stacked node of shape [w, block...].
func unstack(stacked *G.Node, w int) (G.Nodes, error) {
	s := stacked.Shape()
	if len(s) == 0 || s[0] != w {
		return nil, fmt.Errorf("dist: cannot cut a node of shape %v into %d blocks: %w", s, w, ErrInvalidArgument)
	}
	out := make(G.Nodes, w)
	for i := range out {
		op := blockOp{i: i, stacked: s.Clone(), dt: stacked.Dtype(), inType: stacked.Type(), outType: typeOf(s[1:], stacked.Dtype())}
		n, err := G.ApplyOp(op, stacked)
		if err != nil {
			return nil, fmt.Errorf("dist: taking block %d of %v: %v: %w", i, s, err, ErrInvalidArgument)
		}
		out[i] = n
	}
	return out, nil
}

// typeOf is the gorgonia type of a node of the given shape and dtype.
func typeOf(s tensor.Shape, dt tensor.Dtype) hm.Type {
	if len(s) == 0 {
		return dt
	}
	return G.TensorType{Dims: len(s), Of: dt}
}

func (op blockOp) Arity() int           { return 1 }
func (op blockOp) Type() hm.Type        { return hm.NewFnType(op.inType, op.outType) }
func (op blockOp) ReturnsPtr() bool     { return false }
func (op blockOp) CallsExtern() bool    { return false }
func (op blockOp) OverwritesInput() int { return -1 }
func (op blockOp) String() string       { return fmt.Sprintf("block(%d of %v)", op.i, op.stacked) }
func (op blockOp) InferShape(...G.DimSizer) (tensor.Shape, error) {
	return op.stacked[1:].Clone(), nil
}
func (op blockOp) WriteHash(h hash.Hash) {
	fmt.Fprintf(h, "tandem/dist.block|%d|%v|%v", op.i, op.stacked, op.dt)
}
func (op blockOp) Hashcode() uint32 { return hashOf(op) }

// DiffWRT: the block is linear in the stack.
func (op blockOp) DiffWRT(n int) []bool { return trues(n) }

// SymDiff places the block's gradient into zeros of the stacked shape.
func (op blockOp) SymDiff(inputs G.Nodes, _, grad *G.Node) (G.Nodes, error) {
	back := placeOp{i: op.i, stacked: op.stacked, dt: op.dt, inType: grad.Type(), outType: op.inType}
	n, err := G.ApplyOp(back, grad)
	if err != nil {
		return nil, fmt.Errorf("dist: %v: gradient: %v: %w", op, err, ErrInvalidArgument)
	}
	return G.Nodes{n}, nil
}

func (op blockOp) Do(inputs ...G.Value) (G.Value, error) {
	return op.UsePreallocDo(nil, inputs...)
}

// UsePreallocDo copies block i into prealloc when it fits, else into a new
// buffer.
func (op blockOp) UsePreallocDo(prealloc G.Value, inputs ...G.Value) (G.Value, error) {
	if len(inputs) != 1 {
		return nil, fmt.Errorf("dist: %v: got %d inputs, want 1: %w", op, len(inputs), ErrInvalidArgument)
	}
	src, dt, err := flatOf(inputs[0])
	if err != nil {
		return nil, fmt.Errorf("dist: %v: %v: %w", op, err, ErrInvalidArgument)
	}
	n := op.stacked[1:].TotalSize()
	if dt != op.dt || flatLen(src) != op.stacked[0]*n {
		return nil, fmt.Errorf("dist: %v: input of dtype %v with %d elements: %w", op, dt, flatLen(src), ErrInvalidArgument)
	}
	out := reuse(prealloc, op.dt, n)
	copyFlat(out, 0, subFlat(src, op.i*n, (op.i+1)*n))
	return result(out, op.outType, op.stacked[1:]), nil
}

func (op placeOp) Arity() int           { return 1 }
func (op placeOp) Type() hm.Type        { return hm.NewFnType(op.inType, op.outType) }
func (op placeOp) ReturnsPtr() bool     { return false }
func (op placeOp) CallsExtern() bool    { return false }
func (op placeOp) OverwritesInput() int { return -1 }
func (op placeOp) String() string       { return fmt.Sprintf("place(%d into %v)", op.i, op.stacked) }
func (op placeOp) InferShape(...G.DimSizer) (tensor.Shape, error) {
	return op.stacked.Clone(), nil
}
func (op placeOp) WriteHash(h hash.Hash) {
	fmt.Fprintf(h, "tandem/dist.place|%d|%v|%v", op.i, op.stacked, op.dt)
}
func (op placeOp) Hashcode() uint32 { return hashOf(op) }

// DiffWRT: placing is linear.
func (op placeOp) DiffWRT(n int) []bool { return trues(n) }

// SymDiff takes block i of the stacked gradient.
func (op placeOp) SymDiff(inputs G.Nodes, _, grad *G.Node) (G.Nodes, error) {
	back := blockOp{i: op.i, stacked: op.stacked, dt: op.dt, inType: grad.Type(), outType: op.inType}
	n, err := G.ApplyOp(back, grad)
	if err != nil {
		return nil, fmt.Errorf("dist: %v: gradient: %v: %w", op, err, ErrInvalidArgument)
	}
	return G.Nodes{n}, nil
}

func (op placeOp) Do(inputs ...G.Value) (G.Value, error) {
	return op.UsePreallocDo(nil, inputs...)
}

// UsePreallocDo writes zeros and the input at block i into prealloc when it
// fits, else into a new buffer.
func (op placeOp) UsePreallocDo(prealloc G.Value, inputs ...G.Value) (G.Value, error) {
	if len(inputs) != 1 {
		return nil, fmt.Errorf("dist: %v: got %d inputs, want 1: %w", op, len(inputs), ErrInvalidArgument)
	}
	src, dt, err := flatOf(inputs[0])
	if err != nil {
		return nil, fmt.Errorf("dist: %v: %v: %w", op, err, ErrInvalidArgument)
	}
	n := op.stacked[1:].TotalSize()
	if dt != op.dt || flatLen(src) != n {
		return nil, fmt.Errorf("dist: %v: input of dtype %v with %d elements: %w", op, dt, flatLen(src), ErrInvalidArgument)
	}
	out := reuse(prealloc, op.dt, op.stacked.TotalSize())
	zeroFlat(out)
	copyFlat(out, op.i*n, src)
	return result(out, op.outType, op.stacked), nil
}

func hashOf(op interface{ WriteHash(hash.Hash) }) uint32 {
	h := fnv.New32a()
	op.WriteHash(h)
	return h.Sum32()
}

func trues(n int) []bool {
	d := make([]bool, n)
	for i := range d {
		d[i] = true
	}
	return d
}
