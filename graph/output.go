package graph

import (
	"fmt"
	"slices"

	G "gorgonia.org/gorgonia"
	"gorgonia.org/tensor"
)

// SetOutput makes every later run put the value of node n into dst: the
// executor hands dst to n's op as the buffer to write into
// (gorgonia.UsePreallocDoer's prealloc, or ContextDoer's), and when the op
// returns its result somewhere else after all it copies the result into dst.
// After a run n.Value() and Value(n) are dst. A data-parallel wrapper uses it
// to compute gradients straight into the buckets it reduces.
//
// The program takes dst for n's alone: it keeps none of its own buffers in
// that memory, and a buffer of another node found to overlap dst is dropped
// before the next run. The caller keeps dst from being any other node's
// value or input.
//
// dst must have n's shape and dtype; a dense tensor must own contiguous
// memory (no view). A nil dst gives n back to the executor's own buffers: it
// never writes into a former output again. n must be a node the program
// computes (not an input, gorgonia.Set or gorgonia.Read). Call SetOutput
// between runs: it waits for a run in progress to end, so a hook, which the
// run waits for, must not call it.
func (p *Program) SetOutput(n *G.Node, dst G.Value) error {
	i, ok := p.index[n]
	if !ok {
		return fmt.Errorf("graph: SetOutput: node %v is not in the program: %w", n, ErrInvalidArgument)
	}
	if p.kind[i] != kindOp {
		return fmt.Errorf("graph: SetOutput: node %q is not computed by an op of the program: %w", n.Name(), ErrInvalidArgument)
	}
	if dst != nil {
		if err := fitsNode(n, dst); err != nil {
			return fmt.Errorf("graph: SetOutput: node %q: %w", n.Name(), err)
		}
	}
	p.runMu.Lock()
	defer p.runMu.Unlock()
	if sameObject(p.out[i], dst) || (p.out[i] == nil && dst == nil) {
		return nil
	}
	p.out[i] = dst
	p.outNodes = slices.DeleteFunc(p.outNodes, func(k int32) bool { return k == i })
	if dst != nil {
		p.outNodes = append(p.outNodes, i)
	}
	// The kept buffers are checked again against the new output (or
	// without the old one) before the next run.
	p.bufs[i] = nil
	p.outSet = true
	return nil
}

// Output returns the memory set with SetOutput for n, or nil. Like Value,
// it must not be called while a run is in progress.
func (p *Program) Output(n *G.Node) G.Value {
	i, ok := p.index[n]
	if !ok {
		return nil
	}
	return p.out[i]
}

// fitsNode checks that v can hold n's value.
func fitsNode(n *G.Node, v G.Value) error {
	if v.Dtype() != n.Dtype() {
		return fmt.Errorf("output of dtype %v for a node of dtype %v: %w", v.Dtype(), n.Dtype(), ErrInvalidArgument)
	}
	if !v.Shape().Eq(n.Shape()) {
		return fmt.Errorf("output of shape %v for a node of shape %v: %w", v.Shape(), n.Shape(), ErrInvalidArgument)
	}
	if d, ok := v.(*tensor.Dense); ok && (d.IsView() || d.RequiresIterator()) {
		return fmt.Errorf("output is a view; give a tensor with memory of its own: %w", ErrInvalidArgument)
	}
	if _, ok := spanOf(v); !ok {
		return fmt.Errorf("output %T has no memory to write into: %w", v, ErrInvalidArgument)
	}
	return nil
}

// intoOutput makes v, node i's result, land in the node's output when it
// has one, copying when the op wrote elsewhere.
func (p *Program) intoOutput(i int32, v G.Value) (G.Value, error) {
	dst := p.out[i]
	if dst == nil || v == nil {
		return v, nil
	}
	if sameMemory(v, dst) {
		return dst, nil
	}
	if _, err := G.Copy(dst, v); err != nil {
		return nil, fmt.Errorf("copying the result into the output set with SetOutput: %w", err)
	}
	return dst, nil
}
