package store

import (
	"context"
	"fmt"
	"time"

	"github.com/tandemml/tandem/internal/errs"
)

// deadline returns when a blocking call that starts now must give up. The
// caller's context governs: with no timeout of the call's own (timeout not
// positive), a context deadline is the bound however far off it is, and the
// store's default def applies only to a context without one. A positive
// timeout (Wait's argument) bounds the call as well, whichever ends first.
// ctxBound reports that the context's deadline is the bound.
func deadline(ctx context.Context, timeout, def time.Duration) (d time.Time, ctxBound bool) {
	cd, hasDeadline := ctx.Deadline()
	if timeout <= 0 {
		if hasDeadline {
			return cd, true
		}
		timeout = def
	}
	d = time.Now().Add(timeout)
	if hasDeadline && !cd.After(d) {
		return cd, true
	}
	return d, false
}

// waitError explains why a blocking call on keys gave up. A context that was
// cancelled (not expired) yields its own error; an expired context or
// timeout yields ErrTimeout (wrapping context.DeadlineExceeded as well when
// the context's deadline was the bound, even if the context has not noticed
// yet).
func waitError(ctx context.Context, op string, keys []string, timeout time.Duration, ctxBound bool) error {
	what := fmt.Sprintf("store: %s: waiting for keys %q", op, keys)
	switch {
	case ctx.Err() != nil:
		return errs.FromContext(ctx, what)
	case ctxBound:
		return errs.Expired(what)
	}
	return fmt.Errorf("%s: gave up after %v; check that the rank that sets them is alive, or raise the timeout: %w",
		what, timeout.Round(time.Millisecond), ErrTimeout)
}

// ctxError reports a context that ended before or during a non-blocking call.
func ctxError(ctx context.Context, op string) error {
	return errs.FromContext(ctx, "store: "+op)
}

// enter refuses a call whose context is nil (ErrInvalidArgument) or has
// already ended.
func enter(ctx context.Context, op string) error {
	if err := errs.CheckContext(ctx, "store", op); err != nil {
		return err
	}
	return ctxError(ctx, op)
}

func closedError(op string) error {
	return fmt.Errorf("store: %s: %w", op, ErrClosed)
}

func checkMulti(op string, keys []string, values [][]byte) error {
	if len(keys) != len(values) {
		return fmt.Errorf("store %s got %d keys and %d values; pass one value per key: %w",
			op, len(keys), len(values), ErrInvalidArgument)
	}
	return nil
}
