package errs

import (
	"context"
	"errors"
	"io"
	"strings"
	"testing"
	"time"
)

func expired(t *testing.T) context.Context {
	ctx, cancel := context.WithDeadline(context.Background(), time.Now().Add(-time.Second))
	t.Cleanup(cancel)
	return ctx
}

func cancelled(cause error) context.Context {
	ctx, cancel := context.WithCancelCause(context.Background())
	cancel(cause)
	return ctx
}

func TestFromContext(t *testing.T) {
	if err := FromContext(context.Background(), "pkg: op"); err != nil {
		t.Fatalf("live context: %v", err)
	}
	err := FromContext(expired(t), "pkg: op: detail")
	if !errors.Is(err, Timeout) || !errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) {
		t.Errorf("deadline: %v, want Timeout and DeadlineExceeded", err)
	}
	if got, want := err.Error(), "pkg: op: detail: tandem: timeout: context deadline exceeded"; got != want {
		t.Errorf("deadline message %q, want %q", got, want)
	}
	err = FromContext(cancelled(nil), "pkg: op")
	if !errors.Is(err, context.Canceled) || errors.Is(err, Timeout) || errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("cancel: %v, want Canceled only", err)
	}
	err = FromContext(cancelled(io.EOF), "pkg: op")
	if !errors.Is(err, context.Canceled) || !errors.Is(err, io.EOF) || errors.Is(err, Timeout) {
		t.Errorf("cancel with cause: %v, want Canceled and the cause", err)
	}
}

func TestWrapAndAnnotate(t *testing.T) {
	cause := errors.New("connection reset")
	err := Wrap(context.Background(), "pkg: op", cause)
	if err.Error() != "pkg: op: connection reset" || !errors.Is(err, cause) || errors.Is(err, Timeout) {
		t.Errorf("live context: %v", err)
	}
	err = Wrap(expired(t), "pkg: op", cause)
	if !errors.Is(err, cause) || !errors.Is(err, Timeout) || !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("deadline: %v, want the cause, Timeout and DeadlineExceeded", err)
	}
	err = Wrap(cancelled(nil), "pkg: op", cause)
	if !errors.Is(err, cause) || !errors.Is(err, context.Canceled) || errors.Is(err, Timeout) {
		t.Errorf("cancel: %v, want the cause and Canceled only", err)
	}
	// Errors that already tell are left alone, or completed.
	ctx := expired(t)
	full := FromContext(ctx, "inner")
	if got := Annotate(ctx, full); got != full {
		t.Errorf("Annotate changed a complete error: %v", got)
	}
	if got := Annotate(ctx, context.DeadlineExceeded); !errors.Is(got, Timeout) || strings.Count(got.Error(), "deadline") != 1 {
		t.Errorf("Annotate(DeadlineExceeded) = %v, want Timeout added once", got)
	}
	if got := Annotate(ctx, Timeout); !errors.Is(got, context.DeadlineExceeded) || strings.Count(got.Error(), "timeout") != 1 {
		t.Errorf("Annotate(Timeout) = %v, want DeadlineExceeded added once", got)
	}
	if got := Annotate(context.Background(), cause); got != cause {
		t.Errorf("Annotate with a live context = %v", got)
	}
	if err := Expired("pkg: op"); !errors.Is(err, Timeout) || !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Expired: %v", err)
	}
}

func TestCheckContext(t *testing.T) {
	if err := CheckContext(context.Background(), "pkg", "op"); err != nil {
		t.Fatal(err)
	}
	//lint:ignore SA1012 a nil context is what is under test
	if err := CheckContext(nil, "pkg", "op"); !errors.Is(err, InvalidArgument) || !strings.HasPrefix(err.Error(), "pkg: op: ") {
		t.Errorf("nil context: %v, want InvalidArgument", err)
	}
}

func TestKind(t *testing.T) {
	k := Kind("pkg: thing does not match", Mismatch)
	err := errors.Join(errors.New("x"), k)
	if !errors.Is(err, k) || !errors.Is(err, Mismatch) || errors.Is(k, InvalidArgument) {
		t.Errorf("Kind: errors.Is fails for %v", err)
	}
	if k.Error() != "pkg: thing does not match" {
		t.Errorf("message %q", k.Error())
	}
}
