package rpc

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"
)

// Work started with Go holds a graceful shutdown of the whole group until
// it returns; its context stays live meanwhile.
func TestGoHoldsGracefulShutdown(t *testing.T) {
	agents := startGroup(t, 2, nil)
	release := make(chan struct{})
	var sawCancel atomic.Bool
	if !agents[0].Go(func(ctx context.Context) {
		select {
		case <-release:
		case <-ctx.Done():
			sawCancel.Store(true)
		}
	}) {
		t.Fatal("Go refused on a running agent")
	}
	done := make(chan []error, 1)
	go func() { done <- shutdownAll(agents) }()
	select {
	case errs := <-done:
		t.Fatalf("the group shut down while work started with Go ran: %v", errs)
	case <-time.After(300 * time.Millisecond):
	}
	close(release)
	select {
	case errs := <-done:
		for i, err := range errs {
			if err != nil {
				t.Fatalf("shutdown %d: %v", i, err)
			}
		}
	case <-time.After(20 * time.Second):
		t.Fatal("the group did not shut down once the work returned")
	}
	if sawCancel.Load() {
		t.Fatal("the work's context was cancelled during the graceful wait")
	}
}

// Close cancels the context of work started with Go and waits for it to
// return; Go refuses afterwards, and Close and Shutdown report ErrClosed.
func TestCloseEndsGoroutines(t *testing.T) {
	agents := startGroup(t, 1, nil)
	a := agents[0]
	var returned atomic.Bool
	started := make(chan struct{})
	a.Go(func(ctx context.Context) {
		close(started)
		<-ctx.Done()
		time.Sleep(100 * time.Millisecond) // cleanup that Close waits for
		returned.Store(true)
	})
	<-started
	if err := a.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if !returned.Load() {
		t.Fatal("Close returned before the agent's goroutine did")
	}
	if a.Go(func(context.Context) { t.Error("ran after Close") }) {
		t.Fatal("Go started work on a closed agent")
	}
	if err := a.Close(); !errors.Is(err, ErrClosed) {
		t.Fatalf("second Close: %v", err)
	}
	if err := a.Shutdown(context.Background()); !errors.Is(err, ErrClosed) {
		t.Fatalf("Shutdown after Close: %v", err)
	}
	select {
	case <-a.ShuttingDown():
	default:
		t.Fatal("ShuttingDown not closed after Close")
	}
}

// Close during a graceful Shutdown that waits for a worker that never
// shuts down ends the wait at once, with ErrClosed.
func TestCloseEndsGracefulWait(t *testing.T) {
	agents := startGroup(t, 2, nil)
	done := make(chan error, 1)
	go func() { done <- agents[0].Shutdown(context.Background()) }() // w1 never joins
	select {
	case err := <-done:
		t.Fatalf("Shutdown returned while w1 runs: %v", err)
	case <-time.After(300 * time.Millisecond):
	}
	start := time.Now()
	if err := agents[0].Close(); err != nil {
		t.Fatalf("Close during Shutdown: %v", err)
	}
	select {
	case err := <-done:
		if !errors.Is(err, ErrClosed) {
			t.Fatalf("Shutdown ended by Close: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Shutdown still waiting 10 s after Close")
	}
	t.Logf("Shutdown returned %v after Close", time.Since(start))
}

// Shutdown hooks run on a graceful Shutdown only, close hooks once on
// either; their errors are returned.
func TestShutdownAndCloseHooks(t *testing.T) {
	errHook := errors.New("hook failed")
	for _, graceful := range []bool{true, false} {
		agents := startGroup(t, 1, nil)
		a := agents[0]
		var shut, closed atomic.Int32
		a.OnShutdown(func(ctx context.Context) error {
			shut.Add(1)
			if _, ok := ctx.Deadline(); !ok {
				t.Error("the shutdown hook did not get Shutdown's context")
			}
			return nil
		})
		a.OnClose(func() error {
			closed.Add(1)
			return errHook
		})
		var err error
		if graceful {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			err = a.Shutdown(ctx)
			cancel()
		} else {
			err = a.Close()
		}
		if !errors.Is(err, errHook) {
			t.Fatalf("graceful %v: the close hook's error is not returned: %v", graceful, err)
		}
		a.Close()
		wantShut := int32(0)
		if graceful {
			wantShut = 1
		}
		if shut.Load() != wantShut || closed.Load() != 1 {
			t.Fatalf("graceful %v: shutdown hooks ran %d times, close hooks %d", graceful, shut.Load(), closed.Load())
		}
	}
}
