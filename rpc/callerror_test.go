package rpc

import (
	"context"
	"errors"
	"testing"
	"time"
)

// asCallError checks that err is a *CallError of op to peer's function fn.
func asCallError(t *testing.T, what string, err error, op, peer, fn string) *CallError {
	t.Helper()
	var ce *CallError
	if !errors.As(err, &ce) {
		t.Fatalf("%s: %T %v is not a *CallError", what, err, err)
	}
	if ce.Op != op || ce.Peer != peer || ce.Func != fn {
		t.Fatalf("%s: CallError{Op %q, Peer %q, Func %q}, want {%q, %q, %q}", what, ce.Op, ce.Peer, ce.Func, op, peer, fn)
	}
	if errors.Unwrap(err) != ce.Err {
		t.Fatalf("%s: Unwrap does not give the cause", what)
	}
	return ce
}

// Every failing call returns a *CallError naming the call, whose cause
// still matches the sentinels, the context's errors and a RemoteError.
func TestCallErrors(t *testing.T) {
	agents := startGroup(t, 2, registerBasics)
	a := agents[0]
	ctx := context.Background()

	_, err := Sync[int](ctx, a, "w1", "fail", "disk on fire")
	ce := asCallError(t, "remote failure", err, "call", "w1", "fail")
	var re *RemoteError
	if !errors.As(ce.Err, &re) || re.Message != "disk on fire" || !errors.Is(err, ErrRemote) {
		t.Fatalf("remote failure: the cause %v is not the RemoteError", ce.Err)
	}
	if want := `rpc: call "fail" on worker w1: the function failed: disk on fire`; err.Error() != want {
		t.Fatalf("message %q, want %q", err, want)
	}

	_, err = Sync[string](ctx, a, "w1", "sleep", time.Minute, WithTimeout(50*time.Millisecond))
	asCallError(t, "call timeout", err, "call", "w1", "sleep")
	if !errors.Is(err, ErrTimeout) || errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("call timeout: %v", err)
	}

	dctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	_, err = Sync[string](dctx, a, "w1", "sleep", time.Minute)
	cancel()
	asCallError(t, "deadline", err, "call", "w1", "sleep")
	if !errors.Is(err, ErrTimeout) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("deadline: %v", err)
	}

	cctx, cancel := context.WithCancel(ctx)
	time.AfterFunc(50*time.Millisecond, cancel)
	_, err = Async[string](cctx, a, "w1", "sleep", time.Minute).Wait(ctx)
	asCallError(t, "cancelled async", err, "call", "w1", "sleep")
	if !errors.Is(err, context.Canceled) || errors.Is(err, ErrTimeout) {
		t.Fatalf("cancelled: %v", err)
	}

	_, err = Sync[int](ctx, a, "nobody", "add", [2]int{1, 2})
	asCallError(t, "unknown worker", err, "call", "nobody", "add")
	if !errors.Is(err, ErrInvalidArgument) {
		t.Fatalf("unknown worker: %v", err)
	}

	_, err = a.CallLocal(ctx, "boom", struct{}{}).Wait(ctx)
	asCallError(t, "local panic", err, "call", "w0", "boom")
	if !errors.Is(err, ErrPanic) {
		t.Fatalf("local panic: %v", err)
	}

	// The callee goes away: ErrPeerLost, through the error type.
	if err := agents[1].Close(); err != nil {
		t.Fatal(err)
	}
	_, err = Sync[int](ctx, a, "w1", "add", [2]int{1, 2})
	asCallError(t, "lost callee", err, "call", "w1", "add")
	if !errors.Is(err, ErrPeerLost) {
		t.Fatalf("lost callee: %v", err)
	}

	// This agent closes: ErrClosed.
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	_, err = Sync[int](ctx, a, "w1", "add", [2]int{1, 2})
	asCallError(t, "closed caller", err, "call", "w1", "add")
	if !errors.Is(err, ErrClosed) {
		t.Fatalf("closed caller: %v", err)
	}
}
