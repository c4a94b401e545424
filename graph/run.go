package graph

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"

	G "gorgonia.org/gorgonia"

	"github.com/tandemml/tandem/internal/errs"
)

// Run binds the given values to input nodes and runs the program once. Each
// node runs as soon as all its inputs are ready, on up to Workers goroutines;
// after Run returns every node's value is bound to it (n.Value(), and
// n.Grad() for differentiated nodes) as after a TapeMachine run, and is also
// available from Program.Value.
//
// The first error stops the run: an op's error or panic, a hook's error, or
// ctx being done (no further node is started then, and ops implementing
// ContextDoer see the cancellation). The error names the node and its op.
// Run returns only after every op it started has returned, so no goroutine
// of the run outlives it, and the program can be run again afterwards.
// Calls to Run on one program are serialized.
func (p *Program) Run(ctx context.Context, bindings ...Binding) error {
	if ctx == nil {
		return fmt.Errorf("graph: Run: nil context: %w", ErrInvalidArgument)
	}
	p.runMu.Lock()
	defer p.runMu.Unlock()
	for _, b := range bindings {
		if b == nil {
			return fmt.Errorf("graph: Run: nil binding: %w", ErrInvalidArgument)
		}
		if err := b.apply(p); err != nil {
			return err
		}
	}
	if err := ctx.Err(); err != nil {
		return stopped(ctx, err, 0, len(p.steps))
	}
	clear(p.vals)
	clear(p.owned)
	copy(p.next, p.bufs)
	p.changed.Store(p.outSet)
	p.outSet = false
	for _, i := range p.inputs {
		n := p.nodes[i]
		v := n.Value()
		if v == nil {
			return fmt.Errorf("graph: Run: input node %q has no value; bind one with graph.Bind or gorgonia.Let: %w", n.Name(), ErrInvalidArgument)
		}
		p.vals[i] = v
	}
	p.hookCtx = ctx
	p.dropAliasedBuffers()
	defer p.settleBuffers()
	for _, i := range p.inputs {
		if err := p.fireHooks(ctx, i, p.vals[i]); err != nil {
			return err
		}
	}
	if p.cfg.workers == 1 || len(p.par) < 2 {
		return p.runSequential(ctx)
	}
	if err := p.runParallel(ctx); err != nil {
		return err
	}
	for k, i := range p.last {
		if err := ctx.Err(); err != nil {
			return stopped(ctx, err, len(p.par)+k, len(p.steps))
		}
		if err := p.step(ctx, i); err != nil {
			return err
		}
	}
	return nil
}

func (p *Program) runSequential(ctx context.Context) error {
	for k, i := range p.steps {
		if err := ctx.Err(); err != nil {
			return stopped(ctx, err, k, len(p.steps))
		}
		if err := p.step(ctx, i); err != nil {
			return err
		}
	}
	return nil
}

func (p *Program) runParallel(ctx context.Context) error {
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	for _, i := range p.par {
		p.pending[i].Store(p.deps[i])
	}
	for _, i := range p.starts {
		p.queue <- i
	}
	var (
		remaining atomic.Int32
		done      = make(chan struct{})
		errOnce   sync.Once
		firstErr  error
		wg        sync.WaitGroup
	)
	remaining.Store(int32(len(p.par)))
	fail := func(err error) {
		errOnce.Do(func() { firstErr = err; cancel() })
	}
	worker := func() {
		for {
			select {
			case <-rctx.Done():
				return
			case <-done:
				return
			case i := <-p.queue:
				if rctx.Err() != nil {
					return
				}
				if err := p.step(rctx, i); err != nil {
					fail(err)
					return
				}
				for _, c := range p.consumers[i] {
					if p.pending[c].Add(-1) == 0 {
						p.queue <- c
					}
				}
				if remaining.Add(-1) == 0 {
					close(done)
					return
				}
			}
		}
	}
	extra := min(p.cfg.workers, len(p.par)) - 1
	wg.Add(extra)
	for range extra {
		go func() { defer wg.Done(); worker() }()
	}
	worker()
	cancel()
	wg.Wait()
	for len(p.queue) > 0 {
		<-p.queue
	}
	if firstErr != nil {
		return firstErr
	}
	if left := remaining.Load(); left > 0 {
		err := ctx.Err()
		if err == nil {
			err = errors.New("run stopped") // not reachable: workers only stop early on an error or ctx
		}
		return stopped(ctx, err, len(p.par)-int(left), len(p.steps))
	}
	return nil
}

// stopped is the error of a run that ctx stopped after done of total nodes.
func stopped(ctx context.Context, err error, done, total int) error {
	if errors.Is(err, context.DeadlineExceeded) {
		return fmt.Errorf("graph: run stopped after %d of %d nodes: %w: %w", done, total, errs.Timeout, err)
	}
	if cause := context.Cause(ctx); cause != nil && cause != err {
		return fmt.Errorf("graph: run stopped after %d of %d nodes: %w (%w)", done, total, err, cause)
	}
	return fmt.Errorf("graph: run stopped after %d of %d nodes: %w", done, total, err)
}

// Value returns the value node n had in the last run (for an input, the
// value it was run with), or nil if n is not in the program or did not run.
// Like Run, it must not be called while a run is in progress.
func (p *Program) Value(n *G.Node) G.Value {
	i, ok := p.index[n]
	if !ok {
		return nil
	}
	return p.vals[i]
}

// Grad returns the value of wrt's gradient node (see GradNode) from the last
// run.
func (p *Program) Grad(wrt *G.Node) (G.Value, error) {
	gn := p.GradNode(wrt)
	if gn == nil {
		return nil, fmt.Errorf("graph: Grad: node %v has no gradient node in the program; pass gorgonia.Grad's result with WithGrads: %w", wrt, ErrInvalidArgument)
	}
	v := p.Value(gn)
	if v == nil {
		return nil, fmt.Errorf("graph: Grad: the gradient of %q has not been computed; call Run first: %w", wrt.Name(), ErrInvalidArgument)
	}
	return v, nil
}
