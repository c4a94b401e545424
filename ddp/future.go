package ddp

import (
	"context"
	"fmt"

	"gorgonia.org/tensor"

	"github.com/tandemml/tandem/comm"
)

// Future is the pending result of a comm hook: the bucket's reduced
// gradients. Wait blocks until they are ready, or until ctx is done (then it
// returns comm's context error: one wrapping comm.ErrTimeout and
// context.DeadlineExceeded after a deadline, context.Canceled after a
// cancellation), and returns them: either the
// bucket's buffer itself or a tensor of the buffer's dtype and length, which
// DDP copies into the buffer.
//
// DDP calls Wait once per bucket, in bucket order, on the goroutine that
// runs Step, after the backward pass has ended. Work done inside Wait may
// therefore issue further collectives (PowerSGD's second round does): every
// rank issues them in the same order.
type Future interface {
	Wait(ctx context.Context) (*tensor.Dense, error)
}

// doner is implemented by futures that can say when their communication
// finished without being waited on; Stats uses it to time communication.
type doner interface {
	Done() <-chan struct{}
}

// WorkFuture returns the Future that completes with result once w is done,
// or fails with w's error: the usual way for a hook to hand back a
// collective started on the bucket's buffer (or on a tensor derived from it).
func WorkFuture(w comm.Work, result *tensor.Dense) Future {
	return &workFuture{w: w, t: result}
}

type workFuture struct {
	w comm.Work
	t *tensor.Dense
}

func (f *workFuture) Wait(ctx context.Context) (*tensor.Dense, error) {
	if err := f.w.Wait(ctx); err != nil {
		return nil, err
	}
	return f.t, nil
}

func (f *workFuture) Done() <-chan struct{} { return f.w.Done() }

// Then returns the Future that waits for f and then applies fn to its result
// (for example to decompress it). fn runs inside Wait, on the goroutine that
// waits.
func Then(f Future, fn func(ctx context.Context, t *tensor.Dense) (*tensor.Dense, error)) Future {
	return &thenFuture{f: f, fn: fn}
}

type thenFuture struct {
	f  Future
	fn func(ctx context.Context, t *tensor.Dense) (*tensor.Dense, error)
}

func (f *thenFuture) Wait(ctx context.Context) (*tensor.Dense, error) {
	t, err := f.f.Wait(ctx)
	if err != nil {
		return nil, err
	}
	return f.fn(ctx, t)
}

func (f *thenFuture) Done() <-chan struct{} {
	if d, ok := f.f.(doner); ok {
		return d.Done()
	}
	return nil
}

// Ready returns a Future that is already complete with t.
func Ready(t *tensor.Dense) Future { return readyFuture{t: t} }

// Failed returns a Future that fails with err: how a hook reports an error.
func Failed(err error) Future {
	if err == nil {
		err = fmt.Errorf("ddp: Failed(nil): %w", ErrInvalidArgument)
	}
	return readyFuture{err: err}
}

type readyFuture struct {
	t   *tensor.Dense
	err error
}

var closedChan = func() chan struct{} { c := make(chan struct{}); close(c); return c }()

func (f readyFuture) Wait(context.Context) (*tensor.Dense, error) { return f.t, f.err }
func (f readyFuture) Done() <-chan struct{}                       { return closedChan }
