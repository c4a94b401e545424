package autograd

import (
	"context"
	"errors"
	"fmt"
	"time"

	"gorgonia.org/tensor"

	"github.com/tandemml/tandem/rpc"
)

// The protocol's functions, registered on every agent.
const (
	fnGrad     = "autograd.grad"     // gradients for a send function
	fnBackward = "autograd.backward" // run a pass; returns when this worker's part is done
	fnAbort    = "autograd.abort"    // a pass failed elsewhere
	fnRelease  = "autograd.release"  // drop a context
)

// Metadata keys carried by RPCs made inside a context.
const (
	metaCtx     = "autograd-ctx"     // the context id (request)
	metaSend    = "autograd-send"    // the sender's send function id (request and reply)
	metaMask    = "autograd-mask"    // which of the message's tensors are tracked, '0'/'1' each
	metaWorkers = "autograd-workers" // workers the callee knows to take part (reply)
)

type gradMsg struct {
	Ctx, Pass, Send uint64
	Timeout         int64 // nanoseconds left in the pass
	Grads           []*tensor.Dense
}

type passMsg struct {
	Ctx, Pass uint64
	Timeout   int64
}

type abortMsg struct {
	Ctx, Pass uint64
	Reason    string
	Timeout   int64
}

type releaseMsg struct{ Ctx uint64 }

// registerProtocol registers the protocol's functions in reg (agents in
// one process may share a registry, and registering them again is no
// error; each handler finds its own agent in the call's context).
func registerProtocol(reg *rpc.Registry) error {
	return errors.Join(
		rpc.Register(reg, fnGrad, serveGrad),
		rpc.Register(reg, fnBackward, serveBackward),
		rpc.Register(reg, fnAbort, serveAbort),
		rpc.Register(reg, fnRelease, serveRelease),
		rpc.Register(reg, fnOptimNew, serveOptimNew),
		rpc.Register(reg, fnModuleForward, serveModuleForward),
		rpc.Register(reg, fnModuleDrop, serveModuleDrop),
	)
}

func handlerManager(ctx context.Context) (*manager, error) {
	a := rpc.AgentFromContext(ctx)
	if a == nil {
		return nil, fmt.Errorf("autograd: protocol function called outside an agent")
	}
	return managerOf(a)
}

func serveGrad(ctx context.Context, msg gradMsg) (struct{}, error) {
	m, err := handlerManager(ctx)
	if err != nil {
		return struct{}{}, err
	}
	c := m.lookup(ContextID(msg.Ctx))
	if c == nil {
		return struct{}{}, unknownContext(m.agent, ContextID(msg.Ctx))
	}
	p, err := c.passFor(msg.Pass, time.Duration(msg.Timeout), true)
	if err != nil {
		return struct{}{}, err
	}
	from, _ := rpc.CallerFromContext(ctx)
	return struct{}{}, p.receive(from.ID, msg.Send, msg.Grads)
}

func serveBackward(ctx context.Context, msg passMsg) (struct{}, error) {
	m, err := handlerManager(ctx)
	if err != nil {
		return struct{}{}, err
	}
	c := m.lookup(ContextID(msg.Ctx))
	if c == nil {
		return struct{}{}, unknownContext(m.agent, ContextID(msg.Ctx))
	}
	p, err := c.passFor(msg.Pass, time.Duration(msg.Timeout), true)
	if err != nil {
		return struct{}{}, err
	}
	return struct{}{}, p.wait(ctx)
}

func serveAbort(ctx context.Context, msg abortMsg) (struct{}, error) {
	m, err := handlerManager(ctx)
	if err != nil {
		return struct{}{}, err
	}
	c := m.lookup(ContextID(msg.Ctx))
	if c == nil {
		return struct{}{}, nil
	}
	p, err := c.passFor(msg.Pass, time.Duration(msg.Timeout), false)
	if err != nil {
		return struct{}{}, nil
	}
	from, _ := rpc.CallerFromContext(ctx)
	p.fail(fmt.Errorf("%w on worker %s (told by worker %s): %s", ErrAborted, m.agent.Self(), from, msg.Reason))
	return struct{}{}, nil
}

func serveRelease(ctx context.Context, msg releaseMsg) (struct{}, error) {
	m, err := handlerManager(ctx)
	if err != nil {
		return struct{}{}, err
	}
	id := ContextID(msg.Ctx)
	c := m.lookup(id)
	if c == nil {
		return struct{}{}, nil
	}
	targets, first := m.drop(c, fmt.Errorf("%w: autograd: context %s was released", ErrClosed, id))
	if !first {
		return struct{}{}, nil
	}
	// Pass the release on to the workers this part talked to, except the
	// one it came from and the owner (which released everyone it knew).
	from, _ := rpc.CallerFromContext(ctx)
	var rest []int
	for _, w := range targets {
		if w != from.ID && w != id.Worker() {
			rest = append(rest, w)
		}
	}
	if len(rest) > 0 {
		if err := m.releaseOn(ctx, id, rest); err != nil {
			m.agent.Logger().Debug("autograd: passing a context release on", "context", id.String(), "err", err)
		}
	}
	return struct{}{}, nil
}
