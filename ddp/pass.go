package ddp

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	G "gorgonia.org/gorgonia"
	"gorgonia.org/tensor"

	"github.com/tandemml/tandem/graph"
)

// Pass is one iteration of a GraphDDP's reducer, in the spirit of c10d's
// Reducer (prepare_for_backward, the autograd hooks, finalize_backward):
// Prepare opens it, the graph runs once (Run, or any executor the user
// drives), and Finish completes the reduction. Between Run and Finish the
// loop may read any node's value; after Finish it may inspect or clip the
// averaged gradients (node.Grad()) before the update:
//
//	p, err := net.Prepare(ctx)                 // buffers broadcast; buckets armed
//	loss, err := p.Run(ctx, ddp.ByName{"x": x, "y": y})
//	err = p.Finish(ctx)                        // every bucket reduced
//	clip(net.Nodes())                          // the same on every rank
//	err = net.Apply(solver)
//
// A pass opened inside NoSync only accumulates this rank's gradients.
// A Pass is used by one goroutine; one pass per GraphDDP is open at a time.
type Pass struct {
	n               *GraphDDP
	s               *stepState
	pl              plan
	start, runStart time.Time
	ran             bool
	fired           atomic.Int64 // gradient hooks that fired
}

// Prepare opens a pass: it does the collectives that come before the
// forward pass (the bucket rebuild after the first step, the broadcast of
// Buffers) and arms the buckets, so that gradients marked ready (by the
// graph executor's hooks during Run, or by Finish) go out as soon as their
// bucket is complete. It clears node.Grad() of every learnable node.
//
// After Prepare, the graph runs once: Run does it with the DDP's executor.
// A loop that drives the graph itself (its own gorgonia TapeMachine, or
// Program().Run with its own bindings) runs it between Prepare and Finish;
// Finish then reads the gradients from the gradient nodes.
func (n *GraphDDP) Prepare(ctx context.Context) (*Pass, error) {
	if ctx == nil {
		return nil, fmt.Errorf("ddp: Prepare: nil context: %w", ErrInvalidArgument)
	}
	d := n.core
	d.mu.Lock()
	defer d.mu.Unlock()
	if err := d.usable(); err != nil {
		return nil, err
	}
	if n.open != nil {
		return nil, fmt.Errorf("ddp: Prepare: the previous pass is still open; call its Finish first: %w", ErrInvalidArgument)
	}
	p, err := n.prepare(ctx)
	if err != nil {
		d.fail(err)
		return nil, err
	}
	return p, nil
}

func (n *GraphDDP) prepare(ctx context.Context) (*Pass, error) {
	d := n.core
	start := time.Now()
	for pi := range n.nodes {
		if err := n.checkValue(pi); err != nil {
			return nil, err
		}
	}
	pl := d.localPlan()
	if d.joined {
		flags, err := d.exchangeFlags(ctx, pl, true)
		if err != nil {
			return nil, err
		}
		if _, err := d.agreePlan(flags, &pl); err != nil {
			return nil, err
		}
	}
	if err := d.prepare(ctx, pl); err != nil {
		return nil, err
	}
	if !pl.sync && !d.accumulated {
		for _, b := range d.buckets {
			zeroDense(b.buf)
		}
	}
	s := d.newStepState(ctx, pl, n.gp)
	s.afterBackward = n.vm != nil
	n.aimGrads(s)
	p := &Pass{n: n, s: s, pl: pl, start: start, runStart: start}
	for pi, t := range n.gradOut {
		zeroDense(t)
		n.fresh[pi] = false
		if err := n.ensureGrad(pi); err != nil {
			return nil, err
		}
	}
	d.cur = s
	n.open = p
	if pl.sync {
		if err := s.begin(); err != nil {
			s.abandon()
			n.close(p)
			return nil, err
		}
	}
	return p, nil
}

// ensureGrad binds gradOut as the node's dual value again if something
// replaced it.
func (n *GraphDDP) ensureGrad(pi int) error {
	nd := n.nodes[pi]
	if g, err := nd.Grad(); err == nil {
		if t, ok := g.(*tensor.Dense); ok && t == n.gradOut[pi] {
			return nil
		}
	}
	return bindGrad(nd, n.gradOut[pi])
}

// close ends the open pass.
func (n *GraphDDP) close(p *Pass) {
	if n.open == p {
		n.open = nil
	}
	n.core.cur = nil
}

// Sync reports whether the pass reduces gradients (false inside NoSync).
func (p *Pass) Sync() bool { return p.pl.sync }

// Run feeds the inputs and runs the graph once, forward and backward, with
// the DDP's executor. Under the graph executor each gradient is handed to
// its bucket the moment it is computed, and a complete bucket starts its
// all-reduce while the backward pass goes on; under TapeMachine the buckets
// start when the run has ended. It returns this rank's loss. Run may be
// called once per pass.
func (p *Pass) Run(ctx context.Context, feeds Feeds) (float64, error) {
	if ctx == nil {
		return 0, fmt.Errorf("ddp: Run: nil context: %w", ErrInvalidArgument)
	}
	n := p.n
	d := n.core
	d.mu.Lock()
	defer d.mu.Unlock()
	if err := p.current("Run"); err != nil {
		return 0, err
	}
	if p.ran {
		return 0, fmt.Errorf("ddp: Run: the graph already ran in this pass; one pass reduces one run (accumulate several with NoSync): %w", ErrInvalidArgument)
	}
	loss, err := p.run(ctx, feeds)
	if err != nil {
		p.s.abandon()
		n.close(p)
		d.fail(err)
		return 0, err
	}
	return loss, nil
}

func (p *Pass) current(op string) error {
	if err := p.n.core.usable(); err != nil {
		return err
	}
	if p.n.open != p {
		return fmt.Errorf("ddp: %s: the pass is finished; call Prepare for a new one: %w", op, ErrInvalidArgument)
	}
	return nil
}

func (p *Pass) run(ctx context.Context, feeds Feeds) (float64, error) {
	n := p.n
	vals, err := n.feedValues(feeds)
	if err != nil {
		return 0, err
	}
	p.ran = true
	p.runStart = time.Now()
	if n.vm != nil {
		err = n.runTape(vals)
		if err == nil {
			p.s.backwardEnd = time.Now()
			err = p.gather()
		}
		n.vm.Reset()
	} else {
		binds := make([]graph.Binding, len(vals))
		for i, v := range vals {
			binds[i] = graph.Bind(n.inputs[i], v)
		}
		err = n.prog.Run(ctx, binds...)
		p.s.backwardEnd = time.Now()
	}
	if err != nil {
		return 0, fmt.Errorf("ddp: forward and backward pass: %w", err)
	}
	return lossValue(n.loss.Value())
}

// runTape runs the TapeMachine once on the fed values.
func (n *GraphDDP) runTape(vals []*tensor.Dense) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("gorgonia's TapeMachine panicked: %v", r)
		}
	}()
	for i, v := range vals {
		if err := G.Let(n.inputs[i], v); err != nil {
			return fmt.Errorf("feeding node %q: %v: %w", n.inputs[i].Name(), err, ErrInvalidArgument)
		}
	}
	return n.vm.RunAll()
}

// hookReady is the graph executor's gradient hook of learnable node pi.
func (n *GraphDDP) hookReady(pi int, v G.Value) error {
	p := n.open
	if p == nil {
		return fmt.Errorf("ddp: the gradient of %q was computed outside a pass; run the DDP's program between Prepare and Finish: %w", n.nodes[pi].Name(), ErrInvalidArgument)
	}
	p.fired.Add(1)
	return n.gradReady(p.s, pi, v)
}

// gather marks every used gradient ready after a run that fired no hooks,
// reading the gradient nodes' values, bucket by bucket.
func (p *Pass) gather() error {
	n := p.n
	s := p.s
	s.afterBackward = true
	for _, b := range s.buckets {
		for _, pi := range b.params {
			if !n.gp.used[pi] {
				continue
			}
			gn := n.grads[pi]
			v := gn.Value()
			if v == nil {
				return fmt.Errorf("ddp: the gradient node of %q has no value: run the graph, forward and backward, between Prepare and Finish: %w", n.nodes[pi].Name(), ErrInvalidArgument)
			}
			if err := n.gradReady(s, pi, v); err != nil {
				return err
			}
		}
	}
	return nil
}

// Finish completes the pass. When the graph ran outside Run (an executor
// the loop drives), it first reads each gradient from its gradient node
// and hands the buckets to the reduction. It then waits for every bucket,
// and leaves the averaged gradient of every learnable node in node.Grad()
// and Params()[i].Grad (the same tensor). Inside NoSync it leaves there
// this rank's accumulated gradient instead, and communicates nothing.
//
// Finish refuses a gradient that gorgonia accumulated over several runs:
// with BindDualValues, TapeMachine (and the graph executor) add each run's
// gradient to the node's dual value, and averaging that sum would train on
// the wrong gradient. DDP reads each run's own gradient from the gradient
// nodes, so a dual value may hold nothing, or exactly that run's gradient;
// to accumulate several runs, run one pass per run inside NoSync.
func (p *Pass) Finish(ctx context.Context) error {
	if ctx == nil {
		return fmt.Errorf("ddp: Finish: nil context: %w", ErrInvalidArgument)
	}
	n := p.n
	d := n.core
	d.mu.Lock()
	defer d.mu.Unlock()
	if err := p.current("Finish"); err != nil {
		return err
	}
	p.s.ctx = ctx
	err := p.finish()
	n.close(p)
	if err != nil {
		p.s.abandon()
		d.fail(err)
		return err
	}
	return nil
}

func (p *Pass) finish() error {
	n := p.n
	d := n.core
	s := p.s
	if !p.ran {
		switch fired := p.fired.Load(); {
		case fired == 0:
			s.backwardEnd = time.Now()
			if err := p.gather(); err != nil {
				return err
			}
		case int(fired) < n.gp.grads:
			return fmt.Errorf("ddp: Finish: only %d of %d gradients were computed since Prepare: run the whole graph, forward and backward: %w", fired, n.gp.grads, ErrInvalidArgument)
		default:
			s.backwardEnd = time.Now()
		}
	}
	if err := n.checkDuals(); err != nil {
		return err
	}
	if !p.pl.sync {
		for _, pi := range n.gp.hooked {
			d.hasGrad[pi] = true
		}
		n.publish()
		d.accumulated = true
		d.stats.noSyncStep(s, p.runStart, time.Since(p.start))
		if tl := d.cfg.timeline; tl != nil {
			tl.record(d.rank, s, p.start, p.runStart, time.Now())
		}
		return d.stragglerStep(s.ctx, p.start, p.runStart, s.backwardEnd, false)
	}
	if err := s.finish(); err != nil {
		return err
	}
	d.afterSync(s, p.pl)
	n.publish()
	for pi := range n.nodes {
		n.fresh[pi] = d.hasGrad[pi]
	}
	d.stats.syncStep(s, p.runStart, p.start)
	if tl := d.cfg.timeline; tl != nil {
		tl.record(d.rank, s, p.start, p.runStart, time.Now())
	}
	return d.stragglerStep(s.ctx, p.start, p.runStart, s.backwardEnd, true)
}

// publish copies each gradient from its bucket view into the tensor that
// node.Grad() and the Param's Grad share.
func (n *GraphDDP) publish() {
	d := n.core
	for pi, prm := range d.params {
		if !d.hasGrad[pi] {
			continue
		}
		dst, src := n.gradOut[pi], d.view(pi)
		switch dst.Dtype() {
		case tensor.Float64:
			copy(dst.Float64s(), src.Float64s())
		case tensor.Float32:
			copy(dst.Float32s(), src.Float32s())
		}
		prm.Grad = dst
	}
}

// checkDuals fails when a learnable node's dual value holds anything but
// nothing or this run's gradient: gorgonia accumulated several runs into it
// (BindDualValues), and the loop expects that sum to be reduced.
func (n *GraphDDP) checkDuals() error {
	for _, pi := range n.gp.hooked {
		nd := n.nodes[pi]
		g, err := nd.Grad()
		if err != nil {
			continue
		}
		t, ok := g.(*tensor.Dense)
		if !ok {
			continue
		}
		if t != n.gradOut[pi] && n.grads[pi].Value() != nil && sameMemory(n.grads[pi].Value(), t) {
			continue // the node has no dual value: Grad() is the gradient node's value
		}
		if n.direct[pi] && sameMemory(n.grads[pi].Value(), n.core.view(pi)) {
			// This run's gradient went into the bucket, which may be
			// reducing now: nothing to compare with, and a dual value of
			// another tensor should hold nothing.
			if !zeroOrEqual(t, nil) {
				return fmt.Errorf("ddp: the dual value of learnable node %q was replaced during the pass and holds values (gorgonia's BindDualValues, or G.WithGrad): DDP leaves the averaged gradient in the dual value it binds itself; leave that one in place: %w", nd.Name(), ErrInvalidArgument)
			}
		} else if !zeroOrEqual(t, n.grads[pi].Value()) {
			return fmt.Errorf("ddp: the dual value of learnable node %q holds gradients accumulated over several runs of the graph (gorgonia's BindDualValues adds every run's gradient to it): DDP reduces one run per pass, so averaging that sum would train the wrong model; run one pass per micro-batch inside NoSync to accumulate: %w", nd.Name(), ErrInvalidArgument)
		}
		if t != n.gradOut[pi] {
			if err := bindGrad(nd, n.gradOut[pi]); err != nil {
				return err
			}
		}
	}
	return nil
}

// zeroOrEqual reports whether t is all zeros or equal to v elementwise.
func zeroOrEqual(t *tensor.Dense, v G.Value) bool {
	switch t.Dtype() {
	case tensor.Float64:
		return zeroOrEqualOf(t.Float64s(), v)
	case tensor.Float32:
		return zeroOrEqualOf(t.Float32s(), v)
	}
	return true
}

func zeroOrEqualOf[T float32 | float64](a []T, v G.Value) bool {
	zero := true
	for _, x := range a {
		if x != 0 {
			zero = false
			break
		}
	}
	if zero {
		return true
	}
	b, err := valueData[T](v, len(a))
	if err != nil {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}
