package rpctest_test

import (
	"context"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tandemml/tandem/internal/rpctest"
	"github.com/tandemml/tandem/internal/testkit"
	"github.com/tandemml/tandem/rpc"
)

// TestStartGroupServesSetup starts three agents that all serve the function
// setup registered, calls it between every pair, shuts the group down and
// checks that no goroutine is left behind.
func TestStartGroupServesSetup(t *testing.T) {
	before := runtime.NumGoroutine()
	var served atomic.Int64
	agents := rpctest.StartGroup(t, 3, func(reg *rpc.Registry) {
		if err := rpc.Register(reg, "double", func(ctx context.Context, x int) (int, error) {
			served.Add(1)
			return 2 * x, nil
		}); err != nil {
			t.Fatal(err)
		}
	})
	if len(agents) != 3 {
		t.Fatalf("got %d agents, want 3", len(agents))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	names := []string{"w0", "w1", "w2"}
	for i, a := range agents {
		for j, to := range names {
			got, err := rpc.Sync[int](ctx, a, to, "double", 10*i+j)
			if err != nil {
				t.Fatalf("w%d calls %s: %v", i, to, err)
			}
			if got != 2*(10*i+j) {
				t.Fatalf("w%d calls %s: got %d, want %d", i, to, got, 2*(10*i+j))
			}
		}
	}
	for i, err := range rpctest.ShutdownAll(agents) {
		if err != nil {
			t.Fatalf("shutdown w%d: %v", i, err)
		}
	}
	if n := served.Load(); n != 9 {
		t.Fatalf("served %d calls, want 9", n)
	}
	testkit.RequireNoLeak(t, before, testkit.Slack(2))
}

// TestEventuallyWaitsForCondition checks that Eventually returns once the
// condition, made true by another goroutine, holds.
func TestEventuallyWaitsForCondition(t *testing.T) {
	var done atomic.Bool
	go func() {
		time.Sleep(20 * time.Millisecond)
		done.Store(true)
	}()
	rpctest.Eventually(t, "the flag is set", done.Load)
	if !done.Load() {
		t.Fatal("Eventually returned before the condition held")
	}
}
