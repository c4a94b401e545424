package store

import (
	"context"
	"errors"
	"fmt"
	"time"
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
	err := ctx.Err()
	if err == nil && ctxBound {
		err = context.DeadlineExceeded
	}
	if err != nil {
		if errors.Is(err, context.DeadlineExceeded) {
			return fmt.Errorf("%w: store %s waiting for keys %q: %w", ErrTimeout, op, keys, err)
		}
		return fmt.Errorf("store %s waiting for keys %q: %w", op, keys, err)
	}
	return fmt.Errorf("%w: store %s waiting for keys %q gave up after %v; "+
		"check that the rank that sets them is alive, or raise the timeout", ErrTimeout, op, keys, timeout.Round(time.Millisecond))
}

// ctxError reports a context that ended before a non-blocking call could run.
func ctxError(ctx context.Context, op string) error {
	err := ctx.Err()
	if errors.Is(err, context.DeadlineExceeded) {
		return fmt.Errorf("%w: store %s: %w", ErrTimeout, op, err)
	}
	return fmt.Errorf("store %s: %w", op, err)
}

func closedError(op string) error {
	return fmt.Errorf("store %s: %w", op, ErrClosed)
}

func checkMulti(op string, keys []string, values [][]byte) error {
	if len(keys) != len(values) {
		return fmt.Errorf("%w: store %s got %d keys and %d values; pass one value per key",
			ErrInvalidArgument, op, len(keys), len(values))
	}
	return nil
}
