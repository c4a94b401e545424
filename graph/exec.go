package graph

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"

	G "gorgonia.org/gorgonia"
	"gorgonia.org/tensor"
)

// ContextDoer is implemented by ops that may block, such as collectives that
// wait on the network. The executor calls DoContext instead of Do, with the
// run's context, which is cancelled when the caller's context is or when
// another node of the run fails; a blocking op must return promptly then.
//
// prealloc is the node's output set with Program.SetOutput, else the value
// the op returned for this node in the previous run when the program owns
// that memory and buffer reuse is on, else nil: the op may write its result
// into it and return it, or ignore it (the executor then copies a result
// into an output set with SetOutput).
type ContextDoer interface {
	DoContext(ctx context.Context, prealloc G.Value, inputs ...G.Value) (G.Value, error)
}

func newPanicError(r any) *PanicError {
	return &PanicError{Value: r, Stack: debug.Stack()}
}

// step runs node i: gathers its inputs, calls its op, binds the value to the
// node, feeds dual values and fires the hooks.
func (p *Program) step(ctx context.Context, i int32) (err error) {
	n := p.nodes[i]
	defer func() {
		// call and fireHooks recover the panics of ops and hooks; this catches
		// the rest (a gorgonia kernel copying or accumulating a value).
		if r := recover(); r != nil {
			err = fmt.Errorf("graph: node %q (%v): %w", n.Name(), n.Op(), newPanicError(r))
		}
	}()
	switch p.kind[i] {
	case kindLet:
		// TapeMachine does not execute gorgonia.Set either.
		return nil
	case kindRead:
		if err := readInto(p.readInto[i], p.vals[p.children[i][0]]); err != nil {
			return fmt.Errorf("graph: node %q (%v): %w", n.Name(), n.Op(), err)
		}
		return nil
	}

	args := p.args[i]
	kids := p.children[i]
	parallel := p.cfg.workers > 1
	for j, c := range kids {
		v := p.vals[c]
		if parallel && p.shared[c] {
			if k := indexBefore(kids, j, c); k >= 0 {
				v = args[k] // the same child twice gets the same header, as in TapeMachine
			} else {
				v = headerCopy(v)
			}
		}
		args[j] = v
	}
	v, err := p.call(ctx, i, args)
	if err == nil && v == nil {
		if _, ok := n.Op().(G.NoRetOp); !ok {
			err = errors.New("op returned no value and no error")
		}
	}
	if err == nil {
		v, err = p.intoOutput(i, v)
	}
	if err != nil {
		return fmt.Errorf("graph: node %q (%v): %w", n.Name(), n.Op(), err)
	}
	p.vals[i] = v
	p.owned[i] = v != nil && disjoint(v, args)
	if p.prealloc[i] {
		keep := v
		if !p.owned[i] || p.out[i] != nil {
			keep = nil // not the program's memory to hand out again
		}
		p.next[i] = keep
		if !sameMemory(keep, p.bufs[i]) {
			p.changed.Store(true)
		}
	}
	if v != nil && !sameObject(n.Value(), v) {
		if err := bindValue(n, v); err != nil {
			return fmt.Errorf("graph: node %q (%v): %w", n.Name(), n.Op(), err)
		}
	}
	if d := p.dualOf[i]; len(d) > 0 {
		for _, src := range d {
			if err := accumulateDual(src, v); err != nil {
				return fmt.Errorf("graph: node %q (%v): binding the gradient of %q: %w", n.Name(), n.Op(), src.Name(), err)
			}
		}
	}
	return p.fireHooks(p.hookCtx, i, v)
}

// call invokes node i's op, using the kept buffer when there is one, and turns
// a panic into an error.
func (p *Program) call(ctx context.Context, i int32, args []G.Value) (v G.Value, err error) {
	defer func() {
		if r := recover(); r != nil {
			v, err = nil, newPanicError(r)
		}
	}()
	op := p.nodes[i].Op()
	pre := p.bufs[i]
	if out := p.out[i]; out != nil {
		if p.accum[i] {
			return op.Do(args...) // it would add into the output (intoOutput copies)
		}
		pre = out
	}
	if cd := p.ctxDoer[i]; cd != nil {
		return cd.DoContext(ctx, pre, args...)
	}
	if pre != nil && p.out[i] != nil {
		if pd, ok := op.(G.UsePreallocDoer); ok {
			if v, err = pd.UsePreallocDo(pre, args...); err == nil {
				return v, nil
			}
		}
		return op.Do(args...) // intoOutput copies the result into the output
	}
	if pre != nil && p.prealloc[i] {
		if v, err = op.(G.UsePreallocDoer).UsePreallocDo(pre, args...); err == nil {
			return v, nil
		}
		// The op cannot use this buffer after all: stop offering it one and
		// compute the plain way (which reports any real error again).
		p.prealloc[i] = false
		p.next[i] = nil
		p.changed.Store(true)
	}
	return op.Do(args...)
}

func indexBefore(s []int32, j int, v int32) int {
	for k, x := range s[:j] {
		if x == v {
			return k
		}
	}
	return -1
}

// sameObject reports whether a and b are the same value object (only pointer
// kinds are compared; anything else counts as different).
func sameObject(a, b G.Value) bool {
	switch x := a.(type) {
	case *tensor.Dense:
		y, ok := b.(*tensor.Dense)
		return ok && x == y
	case *G.F32:
		y, ok := b.(*G.F32)
		return ok && x == y
	case *G.F64:
		y, ok := b.(*G.F64)
		return ok && x == y
	}
	return false
}

// bindValue makes n.Value() return v, keeping a dual value if n has one.
func bindValue(n *G.Node, v G.Value) (err error) {
	defer func() {
		if r := recover(); r != nil {
			// The value's type differs from the node's; accept it if at least
			// shape and dtype agree, as gorgonia.UnsafeLet does.
			if e := G.UnsafeLet(n, v); e != nil {
				err = fmt.Errorf("op returned %v %v, node is %v %v: %v", v.Dtype(), v.Shape(), n.Type(), n.Shape(), e)
			} else {
				err = nil
			}
		}
	}()
	G.WithValue(v)(n)
	return nil
}

// readInto does what TapeMachine does for gorgonia.Read: copy into the
// destination if it holds a value, else store a clone.
func readInto(into *G.Value, v G.Value) error {
	if v == nil {
		return errors.New("nothing to read: the input has no value")
	}
	if *into != nil {
		_, err := G.Copy(*into, v)
		return err
	}
	c, err := G.CloneValue(v)
	if err != nil {
		return err
	}
	*into = c
	return nil
}

// accumulateDual adds the gradient g to the dual value of src, creating the
// dual value the first time, as TapeMachine's BindDualValues does.
func accumulateDual(src *G.Node, g G.Value) error {
	if g == nil {
		return errors.New("no gradient value")
	}
	d, err := src.Grad()
	isDual := err == nil && d != nil
	// Without a dual value, Grad falls back to the value of the node's
	// gradient node.
	if dn := src.Deriv(); isDual && dn != nil && sameMemory(d, dn.Value()) {
		isDual = false
	}
	if isDual {
		if ds, ok := spanOf(d); ok {
			if gs, ok := spanOf(g); !ok || !ds.overlaps(gs) {
				return addInto(d, g)
			}
		}
	}
	c, err := G.CloneValue(g)
	if err != nil {
		return err
	}
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("cannot set the dual value: %v", r)
		}
	}()
	G.WithGrad(c)(src)
	return nil
}

// addInto computes d += g in place.
func addInto(d, g G.Value) error {
	switch dd := d.(type) {
	case *tensor.Dense:
		gt, ok := g.(tensor.Tensor)
		if !ok {
			return fmt.Errorf("gradient is %T, dual value is a tensor", g)
		}
		if !dd.Shape().Eq(gt.Shape()) {
			return fmt.Errorf("gradient shape %v differs from dual value shape %v", gt.Shape(), dd.Shape())
		}
		_, err := tensor.Add(dd, gt, tensor.UseUnsafe())
		return err
	case *G.F64:
		gv, ok := g.(*G.F64)
		if !ok {
			return fmt.Errorf("gradient is %T, dual value is %T", g, d)
		}
		*dd += *gv
		return nil
	case *G.F32:
		gv, ok := g.(*G.F32)
		if !ok {
			return fmt.Errorf("gradient is %T, dual value is %T", g, d)
		}
		*dd += *gv
		return nil
	}
	return fmt.Errorf("cannot accumulate into a dual value of type %T", d)
}
