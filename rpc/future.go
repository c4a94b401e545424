package rpc

import (
	"context"
	"fmt"
	"sync"
)

// Future is the result of an asynchronous call (or of any asynchronous work an
// async handler hands back): it completes once, with a value or an error.
// A Future is safe for concurrent use.
type Future[R any] struct {
	mu        sync.Mutex
	done      chan struct{} // made on demand: futures completed before anyone asks need none
	completed bool
	val       R
	err       error
	callbacks []func(R, error)
}

// NewFuture returns an incomplete future; complete it with Complete.
func NewFuture[R any]() *Future[R] {
	return &Future[R]{}
}

// closedChan is the Done channel of futures completed before Done was asked.
var closedChan = func() chan struct{} {
	c := make(chan struct{})
	close(c)
	return c
}()

// Ready returns a future that is already complete.
func Ready[R any](v R, err error) *Future[R] {
	f := NewFuture[R]()
	f.Complete(v, err)
	return f
}

// Complete sets the future's outcome and runs its callbacks (in the calling
// goroutine). Only the first call has an effect; it reports whether this call
// was the one.
func (f *Future[R]) Complete(v R, err error) bool {
	f.mu.Lock()
	if f.completed {
		f.mu.Unlock()
		return false
	}
	f.completed, f.val, f.err = true, v, err
	cbs := f.callbacks
	f.callbacks = nil
	if f.done != nil {
		close(f.done)
	}
	f.mu.Unlock()
	for _, cb := range cbs {
		cb(v, err)
	}
	return true
}

// Done returns a channel closed when the future completes.
func (f *Future[R]) Done() <-chan struct{} {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.done == nil {
		if f.completed {
			return closedChan
		}
		f.done = make(chan struct{})
	}
	return f.done
}

// Result returns the outcome if the future is complete; ok is false otherwise.
func (f *Future[R]) Result() (v R, err error, ok bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.val, f.err, f.completed
}

// Wait blocks until the future completes or ctx ends. A context that ends
// first yields an error wrapping ErrTimeout and the context's error; the
// work the future stands for is not cancelled by that (a call made with the
// same ctx is: it ends with the same error).
func (f *Future[R]) Wait(ctx context.Context) (R, error) {
	if v, err, ok := f.Result(); ok {
		return v, err
	}
	select {
	case <-f.Done():
		return f.val, f.err
	case <-ctx.Done():
		var zero R
		return zero, ctxError(ctx, "rpc: waiting for a future")
	}
}

// Then runs fn with the outcome once the future completes: at once (in the
// calling goroutine) if it already has, else in the goroutine that completes
// it. For a call's future that is the connection's read loop, which reads
// the other replies meanwhile: fn must not wait for long (starting calls,
// Async, is fine; Sync or Wait on another call of the same connection would
// wait for a reply that this very loop has to read).
func (f *Future[R]) Then(fn func(R, error)) {
	f.mu.Lock()
	if !f.completed {
		f.callbacks = append(f.callbacks, fn)
		f.mu.Unlock()
		return
	}
	v, err := f.val, f.err
	f.mu.Unlock()
	fn(v, err)
}

// Then returns a future completed with fn's result once f completes. No
// goroutine waits in between: fn runs in the goroutine completing f.
func Then[R, S any](f *Future[R], fn func(R, error) (S, error)) *Future[S] {
	out := NewFuture[S]()
	f.Then(func(v R, err error) {
		s, err := fn(v, err)
		out.Complete(s, err)
	})
	return out
}

// ctxError explains a context that ended while doing what: a deadline
// wraps the context's error and ErrTimeout, a cancellation the context's
// error (and its cause, if another).
func ctxError(ctx context.Context, what string) error {
	err := ctx.Err()
	if cause := context.Cause(ctx); cause != nil && cause != err {
		err = fmt.Errorf("%w (%w)", err, cause)
	}
	if ctx.Err() == context.DeadlineExceeded {
		return fmt.Errorf("%s: %w: %w", what, err, ErrTimeout)
	}
	return fmt.Errorf("%s: %w", what, err)
}
