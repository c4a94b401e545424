package graph

import (
	"context"
	"fmt"

	G "gorgonia.org/gorgonia"
)

// ReadyFunc is called when a node's value is ready during a Run: ctx is the
// context given to Run (so work handed off from a hook may outlive the run),
// n the node and v its value, which is also bound to n (n.Value() returns
// it).
//
// Hooks run on the worker goroutine that produced the value, after the value
// is bound and before any node that consumes it is scheduled; so a hook of a
// node always completes before the hooks of the nodes depending on it start.
// A hook therefore sits on the critical path: it must be fast, and anything
// slow (network I/O, a bucketed allreduce) must be handed off to another
// goroutine. Hooks of independent nodes may run at the same time on
// different workers. A hook must read only v and the values of nodes that n
// depends on, and must not modify v while nodes consuming it may still run
// (a parameter's gradient node usually has no consumer, so DDP may write the
// reduced gradient back into it). v stays valid until the next Run of the
// program starts, which writes into it again: work handed off must be
// finished by then. An error returned by a hook stops the run like an op
// error. A node's own hooks run before those registered with OnReady.
type ReadyFunc func(ctx context.Context, n *G.Node, v G.Value) error

// GradFunc is called when the gradient of a node is ready: wrt is the
// differentiated node (a parameter) and grad its gradient's value. The rules
// of ReadyFunc apply.
type GradFunc func(ctx context.Context, wrt *G.Node, grad G.Value) error

// OnReady registers fn to run for every node (inputs included, at the start
// of a run) whose value becomes ready. Statement nodes (gorgonia.Set and
// gorgonia.Read) produce no value and fire no hooks.
func (p *Program) OnReady(fn ReadyFunc) {
	if fn == nil {
		return
	}
	p.hookMu.Lock()
	defer p.hookMu.Unlock()
	var list []ReadyFunc
	if old := p.allHooks.Load(); old != nil {
		list = append(list, *old...)
	}
	list = append(list, fn)
	p.allHooks.Store(&list)
}

// OnNodeReady registers fn to run when the value of n is ready. Registering is
// cheap (it touches only n's list) and may happen between runs or during one.
func (p *Program) OnNodeReady(n *G.Node, fn ReadyFunc) error {
	if fn == nil {
		return fmt.Errorf("graph: OnNodeReady: nil hook: %w", ErrInvalidArgument)
	}
	i, ok := p.index[n]
	if !ok {
		return fmt.Errorf("graph: OnNodeReady: node %v is not in the program: %w", n, ErrInvalidArgument)
	}
	if p.kind[i] == kindLet || p.kind[i] == kindRead {
		return fmt.Errorf("graph: OnNodeReady: node %q is a statement and has no value: %w", n.Name(), ErrInvalidArgument)
	}
	p.hookMu.Lock()
	defer p.hookMu.Unlock()
	var list []ReadyFunc
	if old := p.nodeHooks[i].Load(); old != nil {
		list = append(list, *old...)
	}
	list = append(list, fn)
	p.nodeHooks[i].Store(&list)
	return nil
}

// OnGradReady registers fn to run when the gradient of wrt is ready (see
// GradNode for how the gradient node is found). This is the hook DDP uses to
// start a bucket's allreduce while the rest of the backward pass goes on.
func (p *Program) OnGradReady(wrt *G.Node, fn GradFunc) error {
	if fn == nil {
		return fmt.Errorf("graph: OnGradReady: nil hook: %w", ErrInvalidArgument)
	}
	gn := p.GradNode(wrt)
	if gn == nil {
		return fmt.Errorf("graph: OnGradReady: node %v has no gradient node in the program; pass gorgonia.Grad's result with WithGrads: %w", wrt, ErrInvalidArgument)
	}
	return p.OnNodeReady(gn, func(ctx context.Context, _ *G.Node, v G.Value) error {
		return fn(ctx, wrt, v)
	})
}

// fireHooks runs the hooks of node i, turning a panic into an error.
func (p *Program) fireHooks(ctx context.Context, i int32, v G.Value) (err error) {
	all := p.allHooks.Load()
	own := p.nodeHooks[i].Load()
	if all == nil && own == nil {
		return nil
	}
	n := p.nodes[i]
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("graph: hook of node %q (%v): %w", n.Name(), n.Op(), newPanicError(r))
		}
	}()
	if own != nil {
		for _, fn := range *own {
			if err := fn(ctx, n, v); err != nil {
				return fmt.Errorf("graph: hook of node %q (%v): %w", n.Name(), n.Op(), err)
			}
		}
	}
	if all != nil {
		for _, fn := range *all {
			if err := fn(ctx, n, v); err != nil {
				return fmt.Errorf("graph: hook of node %q (%v): %w", n.Name(), n.Op(), err)
			}
		}
	}
	return nil
}
