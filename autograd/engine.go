package autograd

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"
	"sync"
	"time"

	"gorgonia.org/tensor"

	"github.com/tandemml/tandem/internal/errs"
	"github.com/tandemml/tandem/rpc"
)

// pass is one backward pass of a context on one worker. It processes the
// whole tape recorded here: a node runs once every consumer of each of its
// outputs has contributed (a gradient or "none"), so each function's
// backward runs once per pass with the sum of its gradients, and every
// receive function answers its sender exactly once, which is what lets the
// sender know when its own tensors have all their contributions.
type pass struct {
	c        *Context
	id       uint64
	ctx      context.Context
	cancel   context.CancelCauseFunc
	stopTime func() bool

	mu          sync.Mutex
	nodes       []*node
	remaining   map[*tinfo]int
	acc         map[*tinfo]*tensor.Dense
	owned       map[*tinfo]bool // acc holds a sum this pass allocated
	pendingOuts map[*node]int
	scheduled   map[*node]bool
	sends       map[uint64]*node
	gotSend     map[uint64]bool
	todo        int // nodes not yet processed plus sends not yet answered
	inflight    int // backward functions running and gradient messages unacknowledged
	started     bool
	finished    bool
	err         error
	done        chan struct{}
}

// newPassLocked snapshots the tape (c.mu held) into a pass that ends with
// an error when timeout passes.
func (c *Context) newPassLocked(id uint64, parent context.Context, timeout time.Duration) *pass {
	self := c.m.agent.Self()
	if timeout <= 0 {
		timeout = c.m.agent.DefaultTimeout()
	}
	base, cancelTimeout := context.WithTimeoutCause(detach(parent), timeout,
		fmt.Errorf("%w: autograd: backward pass of %s on worker %s did not finish within %v", ErrTimeout, c.id, self, timeout.Round(time.Millisecond)))
	ctx, cancel := context.WithCancelCause(base)
	p := &pass{
		c: c, id: id, ctx: ctx,
		cancel:      func(err error) { cancel(err); cancelTimeout() },
		nodes:       append([]*node(nil), c.nodes...),
		remaining:   map[*tinfo]int{},
		acc:         map[*tinfo]*tensor.Dense{},
		owned:       map[*tinfo]bool{},
		pendingOuts: map[*node]int{},
		scheduled:   map[*node]bool{},
		sends:       map[uint64]*node{},
		gotSend:     map[uint64]bool{},
		done:        make(chan struct{}),
	}
	for _, n := range p.nodes {
		p.todo++
		if n.kind == kindSend {
			p.sends[n.msg] = n
			continue
		}
		for _, ti := range n.outputs {
			if ti.consumers > 0 {
				p.remaining[ti] = ti.consumers
				p.pendingOuts[n]++
			}
		}
	}
	// The pass fails when its deadline passes or its parent context ends.
	p.stopTime = context.AfterFunc(ctx, func() {
		cause := context.Cause(ctx)
		switch {
		case errors.Is(cause, ErrTimeout):
		case errors.Is(cause, context.DeadlineExceeded):
			cause = fmt.Errorf("%w: autograd: backward pass of %s on worker %s: the deadline passed: %w", ErrTimeout, c.id, self, cause)
		default:
			cause = fmt.Errorf("autograd: backward pass of %s on worker %s stopped: %w", c.id, self, cause)
		}
		p.fail(cause)
	})
	c.passes[id] = p
	return p
}

// passFor returns the pass id of this context, creating it (and starting
// it) when a message of the pass arrives before the pass is known here.
// With start false a new pass is made but not started (an abort that
// overtook the pass's other messages).
func (c *Context) passFor(id uint64, timeout time.Duration, start bool) (*pass, error) {
	c.mu.Lock()
	if c.released {
		c.mu.Unlock()
		return nil, unknownContext(c.m.agent, c.id)
	}
	p := c.passes[id]
	if p != nil {
		c.mu.Unlock()
		return p, nil
	}
	p = c.newPassLocked(id, context.Background(), timeout)
	c.mu.Unlock()
	if start {
		p.start()
	}
	return p, nil
}

// seed adds the gradient g of a root tensor before the pass starts.
func (p *pass) seed(ti *tinfo, g *tensor.Dense) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.addLocked(ti, g)
}

// start schedules every node whose outputs need no contribution (or have
// all of theirs already: messages may arrive before start).
func (p *pass) start() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.started || p.finished {
		return
	}
	p.started = true
	for _, n := range p.nodes {
		if n.kind != kindSend && p.pendingOuts[n] == 0 {
			p.scheduleLocked(n)
		}
	}
	p.checkLocked()
}

func (p *pass) addLocked(ti *tinfo, g *tensor.Dense) error {
	if g == nil || p.finished {
		return nil
	}
	if g.Dtype() != ti.t.Dtype() || g.Shape().TotalSize() != ti.t.Shape().TotalSize() {
		return fmt.Errorf("%w: autograd: gradient of %v %v for a tensor of %v %v", ErrInvalidArgument, g.Dtype(), g.Shape(), ti.t.Dtype(), ti.t.Shape())
	}
	cur := p.acc[ti]
	if cur == nil {
		p.acc[ti] = g // adopted as it is: never written to
		return nil
	}
	if !p.owned[ti] {
		cur = reshapedCopy(cur, ti.t.Shape())
		p.acc[ti] = cur
		p.owned[ti] = true
	}
	return addInto(cur, g)
}

// deliverLocked hands gradient g (nil: no contribution) to tracked tensor ti.
func (p *pass) deliverLocked(ti *tinfo, g *tensor.Dense) error {
	if err := p.addLocked(ti, g); err != nil {
		return err
	}
	left, ok := p.remaining[ti]
	if !ok || left <= 0 {
		return fmt.Errorf("autograd: tensor received more gradient contributions than it has consumers (internal error)")
	}
	p.remaining[ti] = left - 1
	if left == 1 {
		prod := ti.producer
		p.pendingOuts[prod]--
		if p.pendingOuts[prod] == 0 {
			p.scheduleLocked(prod)
		}
	}
	return nil
}

func (p *pass) gradsOfLocked(n *node) []*tensor.Dense {
	gs := make([]*tensor.Dense, len(n.outputs))
	for i, ti := range n.outputs {
		gs[i] = p.acc[ti]
		delete(p.acc, ti)
		delete(p.owned, ti)
	}
	return gs
}

func (p *pass) scheduleLocked(n *node) {
	if p.finished || p.scheduled[n] {
		return
	}
	p.scheduled[n] = true
	grads := p.gradsOfLocked(n)
	switch n.kind {
	case kindLeaf:
		p.todo--
		if g := grads[0]; g != nil {
			if err := p.c.addLeafGrad(n.outputs[0].t, g); err != nil {
				p.failLocked(err)
			}
		}
	case kindFunc:
		p.goLocked(func() { p.runFunc(n, grads) })
	case kindRecv:
		p.goLocked(func() { p.sendGrads(n, grads) })
	}
}

// goLocked runs one node's work of the pass on a goroutine tied to the
// agent's lifetime (rpc.Agent.Go: a graceful shutdown waits for it, and
// closing the agent waits for it to return); on an agent that has closed,
// the pass fails instead.
func (p *pass) goLocked(work func()) {
	p.inflight++
	a := p.c.m.agent
	if a.Go(func(context.Context) { work() }) {
		return
	}
	p.inflight--
	p.todo--
	p.failLocked(fmt.Errorf("%w: autograd: agent %s is closed", ErrClosed, a.Self()))
}

// runFunc runs a function's backward and hands its input gradients on.
func (p *pass) runFunc(n *node, grads []*tensor.Dense) {
	var gin []*tensor.Dense
	var err error
	if anyNonNil(grads) {
		for i, g := range grads {
			if g == nil {
				grads[i] = filled(n.outputs[i].t, 0)
			}
		}
		gin, err = safeBackward(p.ctx, n, grads)
		if err == nil && len(gin) != n.nIn {
			err = fmt.Errorf("%w: autograd: backward of %q returned %d gradients for %d inputs", ErrInvalidArgument, n.name, len(gin), n.nIn)
		}
		if err != nil {
			if p.ctx.Err() != nil && context.Cause(p.ctx) != nil {
				err = context.Cause(p.ctx) // the pass was stopped: report why
			} else {
				err = fmt.Errorf("autograd: backward of %q on worker %s: %w", n.name, p.c.m.agent.Self(), err)
			}
		}
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.inflight--
	p.todo--
	if p.finished {
		return
	}
	if err != nil {
		p.failLocked(err)
		return
	}
	for i, ti := range n.inputs {
		if ti == nil {
			continue
		}
		var g *tensor.Dense
		if gin != nil {
			g = gin[i]
		}
		if err := p.deliverLocked(ti, g); err != nil {
			p.failLocked(fmt.Errorf("autograd: backward of %q, input %d: %w", n.name, i, err))
			return
		}
	}
	p.checkLocked()
}

func safeBackward(ctx context.Context, n *node, grads []*tensor.Dense) (out []*tensor.Dense, err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("panic: %v\n%s", r, debug.Stack())
		}
	}()
	return n.backward(ctx, grads)
}

func anyNonNil(gs []*tensor.Dense) bool {
	for _, g := range gs {
		if g != nil {
			return true
		}
	}
	return false
}

// sendGrads sends the gradients of a receive function's tensors back to
// the send function on the worker that sent them.
func (p *pass) sendGrads(n *node, grads []*tensor.Dense) {
	a := p.c.m.agent
	done := func(err error) {
		p.mu.Lock()
		defer p.mu.Unlock()
		p.inflight--
		p.todo--
		if err != nil {
			p.failLocked(err)
			return
		}
		p.checkLocked()
	}
	to, err := a.WorkerByID(n.peer)
	if err != nil {
		done(err)
		return
	}
	timeout := time.Until(deadlineOf(p.ctx, a.DefaultTimeout()))
	msg := gradMsg{Ctx: uint64(p.c.id), Pass: p.id, Send: n.msg, Timeout: int64(timeout), Grads: grads}
	_, err = rpc.Sync[struct{}](p.ctx, a, to.Name, fnGrad, msg, rpc.WithTimeout(timeout))
	if err != nil {
		if p.ctx.Err() != nil && context.Cause(p.ctx) != nil {
			err = context.Cause(p.ctx)
		} else {
			err = fmt.Errorf("autograd: sending gradients of %s to worker %s: %w", p.c.id, to, err)
		}
	}
	done(err)
}

func deadlineOf(ctx context.Context, def time.Duration) time.Time {
	if d, ok := ctx.Deadline(); ok {
		return d
	}
	return time.Now().Add(def)
}

// receive delivers the gradients that a receiver sent back for send
// function msg.
func (p *pass) receive(from int, msg uint64, grads []*tensor.Dense) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.finished {
		return p.err
	}
	n := p.sends[msg]
	if n == nil {
		err := fmt.Errorf("%w: autograd: worker %d sent gradients for send %s, which %s on worker %s did not record", ErrInvalidArgument, from, msgString(msg), p.c.id, p.c.m.agent.Self())
		p.failLocked(err)
		return err
	}
	if p.gotSend[msg] {
		err := fmt.Errorf("%w: autograd: gradients for send %s of %s arrived twice", ErrInvalidArgument, msgString(msg), p.c.id)
		p.failLocked(err)
		return err
	}
	if len(grads) != len(n.inputs) {
		err := fmt.Errorf("%w: autograd: %d gradients for send %s, which carried %d tracked tensors", ErrInvalidArgument, len(grads), msgString(msg), len(n.inputs))
		p.failLocked(err)
		return err
	}
	p.gotSend[msg] = true
	p.todo--
	for i, ti := range n.inputs {
		if err := p.deliverLocked(ti, grads[i]); err != nil {
			err = fmt.Errorf("autograd: gradients for send %s from worker %d: %w", msgString(msg), from, err)
			p.failLocked(err)
			return err
		}
	}
	p.checkLocked()
	return nil
}

func (p *pass) checkLocked() {
	if !p.finished && p.started && p.todo == 0 && p.inflight == 0 {
		p.finishLocked(nil)
	}
}

func (p *pass) fail(err error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.failLocked(err)
}

func (p *pass) failLocked(err error) {
	if p.finished {
		return
	}
	p.finishLocked(err)
	p.cancel(err)
	p.c.mu.Lock()
	p.c.lastErr = err
	p.c.mu.Unlock()
}

func (p *pass) finishLocked(err error) {
	p.finished = true
	p.err = err
	p.stopTime()
	if err == nil {
		p.cancel(nil)
	}
	// The tape stays with the context; the pass's own bookkeeping goes.
	p.acc, p.owned, p.remaining = nil, nil, nil
	close(p.done)
}

// wait blocks until the pass ends or ctx does.
func (p *pass) wait(ctx context.Context) error {
	select {
	case <-p.done:
		return p.err
	case <-ctx.Done():
		return errs.FromContext(ctx, fmt.Sprintf("autograd: waiting for the backward pass of %s", p.c.id))
	}
}

func (c *Context) addLeafGrad(t, g *tensor.Dense) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if cur := c.leaf[t]; cur != nil {
		return addInto(cur, g)
	}
	c.leaf[t] = reshapedCopy(g, t.Shape())
	return nil
}

// Backward runs a backward pass from roots, tensors produced on this worker
// in the context (typically one scalar loss per micro-batch), each seeded
// with a gradient of ones (the gradient of the sum of its elements). It runs
// on the owner only and returns when every worker that takes part has
// finished its part: every parameter that influenced a root has its
// gradient accumulated in the context on the worker that holds it
// (GetGradients), added to what earlier passes accumulated.
//
// The pass crosses RPC boundaries: the gradient of every tensor a worker
// received goes back to the worker that sent it, which continues backward
// from there. A tensor used along several paths (sent twice, used locally
// and sent, returned to two callers) gets the sum of its contributions
// before its producer runs, so every function's backward runs once per
// pass.
//
// ctx bounds the pass on every worker (without a deadline, the agent's
// default timeout). If any worker fails (a backward function's error, a
// worker that died, the deadline) every worker's pass ends with an error
// (Err on their part of the context), and Backward returns the first cause.
func (c *Context) Backward(ctx context.Context, roots ...*tensor.Dense) error {
	a := c.m.agent
	if !c.owner {
		return fmt.Errorf("%w: autograd: Backward on worker %s of %s: only its owner, worker %d, runs backward", ErrInvalidArgument, a.Self(), c.id, c.id.Worker())
	}
	if len(roots) == 0 {
		return fmt.Errorf("%w: autograd: Backward with no roots", ErrInvalidArgument)
	}
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, a.DefaultTimeout())
		defer cancel()
	}
	timeout := time.Until(deadlineOf(ctx, a.DefaultTimeout()))
	c.mu.Lock()
	if c.released {
		c.mu.Unlock()
		return fmt.Errorf("%w: autograd: Backward on %s, which has ended", ErrClosed, c.id)
	}
	if c.broken != nil {
		err := c.broken
		c.mu.Unlock()
		return fmt.Errorf("%w: autograd: Backward on %s: %w", ErrForwardFailed, c.id, err)
	}
	rootInfo := make([]*tinfo, len(roots))
	for i, r := range roots {
		ti := c.tensors[r]
		if ti == nil {
			c.mu.Unlock()
			return fmt.Errorf("%w: autograd: root %d of Backward is not tracked by %s (pass a tensor that a recorded function returned, as it is)", ErrInvalidArgument, i, c.id)
		}
		rootInfo[i] = ti
	}
	c.passSeq++
	id := makeID(a.Self().ID, c.passSeq)
	p := c.newPassLocked(id, ctx, timeout)
	c.mu.Unlock()
	for i, ti := range rootInfo {
		if err := p.seed(ti, filled(roots[i], 1)); err != nil {
			p.fail(err)
			return err
		}
	}

	// Start the pass on every other worker; each call returns when that
	// worker's part is done.
	// The calls outlive ctx's deadline by a little, so that a pass that
	// runs out of time reports its own timeout rather than a call's.
	callCtx, cancelCalls := context.WithTimeout(detach(context.WithoutCancel(ctx)), timeout+2*time.Second)
	defer cancelCalls()
	others := c.participants()
	calls := make([]*rpc.Future[struct{}], len(others))
	for i, w := range others {
		info, err := a.WorkerByID(w)
		if err != nil {
			p.fail(err)
			break
		}
		msg := passMsg{Ctx: uint64(c.id), Pass: id, Timeout: int64(timeout)}
		calls[i] = rpc.Async[struct{}](callCtx, a, info.Name, fnBackward, msg, rpc.WithTimeout(timeout+2*time.Second))
		calls[i].Then(func(_ struct{}, err error) {
			if err != nil {
				p.fail(fmt.Errorf("autograd: backward pass of %s on worker %s: %w", c.id, info, err))
			}
		})
	}
	p.start()
	err := p.wait(ctx)
	if err == nil {
		for _, f := range calls {
			if f == nil {
				continue
			}
			if _, err = f.Wait(ctx); err != nil {
				break
			}
		}
		err = p.errOr(err)
	}
	if err != nil {
		p.fail(err)
		err = p.errOr(err)
		c.abort(id, others, err)
		return err
	}
	return nil
}

// errOr returns the pass's own error if it failed, else err.
func (p *pass) errOr(err error) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.err != nil {
		return p.err
	}
	return err
}

// abort tells the other workers that pass id failed, and waits (briefly)
// until they know.
func (c *Context) abort(id uint64, workers []int, cause error) {
	a := c.m.agent
	ctx, cancel := context.WithTimeout(context.Background(), abortTimeout)
	defer cancel()
	reason := cause.Error()
	if len(reason) > 4096 {
		reason = reason[:4096] + "…"
	}
	var wg sync.WaitGroup
	for _, w := range workers {
		info, err := a.WorkerByID(w)
		if err != nil {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			msg := abortMsg{Ctx: uint64(c.id), Pass: id, Reason: reason, Timeout: int64(abortTimeout)}
			if _, err := rpc.Sync[struct{}](ctx, a, info.Name, fnAbort, msg); err != nil && !errors.Is(err, ErrPeerLost) && !errors.Is(err, ErrClosed) {
				a.Logger().Debug("autograd: telling a worker that a backward pass failed", "worker", info.Name, "context", c.id.String(), "err", err)
			}
		}()
	}
	wg.Wait()
}

const abortTimeout = 5 * time.Second
