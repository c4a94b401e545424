package rpc

import (
	"context"
	"errors"
	"net"
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
	go func() { early <- agents[0].Shutdown(ctx, true) }()
	calls := 0
	for time.Since(start) < 2*def+def/2 {
		if _, err := Sync[int](ctx, agents[1], "w0", "add", [2]int{calls, 1}); err != nil {
			t.Fatalf("call %d to the worker shutting down: %v", calls, err)
		}
		calls++
		time.Sleep(10 * time.Millisecond)
	}
	if err := agents[1].Shutdown(ctx, true); err != nil {
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
		wg.Go(func() { errs[0] = agents[0].Shutdown(ctx, true) })
		time.Sleep(time.Second)
		wg.Go(func() { errs[1] = agents[1].Shutdown(ctx, true) })
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
		err := agents[0].Shutdown(ctx, true) // w1 keeps running and never joins
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

// TestShutdownStoreHostDies: when the worker that serves the store (rank 0,
// from MASTER_ADDR) dies, the others' graceful shutdown fails within
// seconds with ErrPeerLost naming it, instead of redialling the store's
// refused port until the deadline.
func TestShutdownStoreHostDies(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a process")
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	_, port, _ := net.SplitHostPort(ln.Addr().String())
	ln.Close()
	const token = "store-host-test-token"
	t.Setenv("MASTER_ADDR", "127.0.0.1")
	t.Setenv("MASTER_PORT", port)
	t.Setenv(TokenEnv, token)
	child, out := startServingWorker(t, "RANK=0", "WORLD_SIZE=2")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	reg := NewRegistry()
	registerBasics(1, reg)
	a, err := Init(ctx, "", 1, 2, WithRegistry(reg))
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if v, err := Sync[int](ctx, a, "worker0", "add", [2]int{2, 2}); err != nil || v != 4 {
		t.Fatalf("add: %v %v", v, err)
	}
	done := make(chan error, 1)
	sctx, scancel := context.WithTimeout(context.Background(), time.Minute)
	defer scancel()
	go func() { done <- a.Shutdown(sctx, true) }()
	time.Sleep(300 * time.Millisecond)
	start := time.Now()
	if err := child.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	select {
	case err = <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("shutdown still waiting 30s after the store's host died")
	}
	took := time.Since(start)
	if !errors.Is(err, ErrPeerLost) || !strings.Contains(err.Error(), "worker0") || !strings.Contains(err.Error(), "store") {
		t.Fatalf("shutdown after the store's host died: %v, want ErrPeerLost naming worker0 and the store", err)
	}
	if took > 10*time.Second {
		t.Fatalf("shutdown took %v to notice the store's host died", took)
	}
	t.Logf("shutdown failed %v after the store's host died: %v", took.Round(time.Millisecond), err)
}
