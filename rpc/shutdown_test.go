package rpc

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestShutdownOutlivesDefaultTimeout: a worker that calls Shutdown early
// (a parameter server) waits for the others as long as they work, past the
// agent's default timeout, when its context has no deadline; it used to
// give up after DefaultTimeout and blame the healthy workers.
func TestShutdownOutlivesDefaultTimeout(t *testing.T) {
	const def = time.Second
	agents := startGroup(t, 2, registerBasics, WithDefaultTimeout(def))
	ctx := context.Background()
	start := time.Now()
	early := make(chan error, 1)
	go func() { early <- agents[0].Shutdown(ctx) }()
	calls := 0
	for time.Since(start) < 2*def+def/2 {
		if _, err := Sync[int](ctx, agents[1], "w0", "add", [2]int{calls, 1}); err != nil {
			t.Fatalf("call %d to the worker shutting down: %v", calls, err)
		}
		calls++
		time.Sleep(10 * time.Millisecond)
	}
	if err := agents[1].Shutdown(ctx); err != nil {
		t.Fatalf("shutdown of the busy worker: %v", err)
	}
	if err := <-early; err != nil {
		t.Fatalf("shutdown of the worker that waited %v, past its default timeout of %v: %v", time.Since(start), def, err)
	}
	if took := time.Since(start); took < 2*def {
		t.Fatalf("the early shutdown returned after %v, before the other worker was done", took)
	}
}

// TestShutdownHonoursCallerDeadline: the caller's deadline bounds a graceful
// shutdown, longer or shorter than the agent's default timeout, and when it
// passes the error names the worker still missing as alive, not dead.
func TestShutdownHonoursCallerDeadline(t *testing.T) {
	t.Run("longer", func(t *testing.T) {
		agents := startGroup(t, 2, registerBasics, WithDefaultTimeout(300*time.Millisecond))
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		var wg sync.WaitGroup
		errs := make([]error, 2)
		wg.Go(func() { errs[0] = agents[0].Shutdown(ctx) })
		time.Sleep(time.Second)
		wg.Go(func() { errs[1] = agents[1].Shutdown(ctx) })
		wg.Wait()
		for i, err := range errs {
			if err != nil {
				t.Fatalf("shutdown of w%d under a 10s deadline with a 300ms default timeout: %v", i, err)
			}
		}
	})
	t.Run("shorter", func(t *testing.T) {
		agents := startGroup(t, 2, registerBasics, WithLivenessTimeout(600*time.Millisecond))
		const d = 1500 * time.Millisecond
		ctx, cancel := context.WithTimeout(context.Background(), d)
		defer cancel()
		start := time.Now()
		err := agents[0].Shutdown(ctx) // w1 keeps running and never joins
		took := time.Since(start)
		if !errors.Is(err, ErrTimeout) || errors.Is(err, ErrPeerLost) || !strings.Contains(err.Error(), "w1 (id 1) (alive and connected") {
			t.Fatalf("shutdown while w1 works on: %v, want ErrTimeout naming w1 as alive", err)
		}
		t.Logf("%v", err)
		if took < d-50*time.Millisecond || took > d+3*time.Second {
			t.Fatalf("shutdown with a %v deadline returned after %v", d, took)
		}
	})
}
