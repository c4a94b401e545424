package errs

import (
	"context"
	"errors"
	"fmt"
)

// The context rule, the same in every package: an operation that gives up
// because its context ended returns an error that
//   - after a deadline wraps both Timeout and context.DeadlineExceeded, so
//     errors.Is(err, comm.ErrTimeout) and errors.Is(err,
//     context.DeadlineExceeded) both hold;
//   - after a cancellation wraps context.Canceled and not Timeout (nothing
//     timed out: the caller changed its mind);
//   - in both cases wraps the context's cause too when one was set with
//     context.WithCancelCause or context.WithDeadlineCause.
// A nil context is a programming error: calls refuse it with an error wrapping
// InvalidArgument (see CheckContext).

// FromContext returns the error of an operation, described by what ("pkg: op:
// detail"), that gave up because ctx ended, or nil while ctx has not ended.
func FromContext(ctx context.Context, what string) error {
	if ctx.Err() == nil {
		return nil
	}
	return fmt.Errorf("%s: %w", what, contextErr(ctx))
}

// Wrap is FromContext for an operation that failed with err while (or
// because) ctx ended: the result wraps err and, when ctx has ended, the
// context's error under the rule above (parts err already wraps are not
// added twice). With ctx still live it is simply "what: err".
func Wrap(ctx context.Context, what string, err error) error {
	if ctx.Err() == nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	return Annotate(ctx, fmt.Errorf("%s: %w", what, err))
}

// Annotate returns err itself when ctx has not ended or err already tells
// how it ended, else err with the context's error added under the rule
// above ("err: tandem: timeout: context deadline exceeded").
func Annotate(ctx context.Context, err error) error {
	cerr := ctx.Err()
	if cerr == nil {
		return err
	}
	deadline := errors.Is(cerr, context.DeadlineExceeded)
	hasCtx := errors.Is(err, cerr)
	hasTimeout := errors.Is(err, Timeout)
	switch {
	case hasCtx && (!deadline || hasTimeout):
		return err
	case hasCtx: // a deadline error without Timeout
		return fmt.Errorf("%w: %w", err, Timeout)
	case deadline && hasTimeout:
		return fmt.Errorf("%w: %w", err, withCause(ctx, cerr))
	}
	return fmt.Errorf("%w: %w", err, contextErr(ctx))
}

// Expired returns the error of an operation, described by what, whose
// deadline passed before its context noticed (a timer fired first): it wraps
// Timeout and context.DeadlineExceeded as FromContext would.
func Expired(what string) error {
	return fmt.Errorf("%s: %w: %w", what, Timeout, context.DeadlineExceeded)
}

// CheckContext returns an error wrapping InvalidArgument, described as
// "pkg: op: ...", when ctx is nil, else nil. Every call that takes a context
// starts with it; the description is put together only on that error, so
// that the check costs no allocation on a hot path.
func CheckContext(ctx context.Context, pkg, op string) error {
	if ctx == nil {
		return fmt.Errorf("%s: %s: nil context (pass context.Background() for none): %w", pkg, op, InvalidArgument)
	}
	return nil
}

// contextErr classifies the error of an ended ctx: "tandem: timeout: context
// deadline exceeded" after a deadline, "context canceled" after a
// cancellation, each followed by the cause when it differs.
func contextErr(ctx context.Context) error {
	cerr := withCause(ctx, ctx.Err())
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		return fmt.Errorf("%w: %w", Timeout, cerr)
	}
	return cerr
}

func withCause(ctx context.Context, cerr error) error {
	if cause := context.Cause(ctx); cause != nil && cause != cerr {
		return fmt.Errorf("%w (%w)", cerr, cause)
	}
	return cerr
}
