//go:build linux

package main

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/tandemml/tandem/internal/samehost/samehosttest"
)

// TestHelperRPCBoundPeer stands for `tandem bench rpc -bound-peer=PATH`.
func TestHelperRPCBoundPeer(t *testing.T) {
	runAsBenchWorker(t, func(ctx context.Context, args []string) error {
		return rpcBoundPeer(ctx, strings.TrimPrefix(args[0], "-bound-peer="))
	})
}

// TestHelperRPCBoundPeerThatQuits answers nothing and exits.
func TestHelperRPCBoundPeerThatQuits(t *testing.T) {
	runAsBenchWorker(t, func(ctx context.Context, args []string) error { return nil })
}

// TestRPCBound: the bare pair hands a tensor of an odd size back and forth
// and times every round trip after the warm-up; a second process that
// never answers fails the run within seconds instead of hanging it.
func TestRPCBound(t *testing.T) {
	if !samehosttest.SelfReadable() {
		t.Skip("process_vm_readv is not allowed here: the bound cannot copy")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	times, err := rpcBound(ctx, testLauncher("TestHelperRPCBoundPeer"), 1<<20+3, 3, 20, 1)
	if err != nil {
		t.Fatal(err)
	}
	if len(times) != 20 {
		t.Fatalf("%d round trips timed, want 20", len(times))
	}
	for i, d := range times {
		if d <= 0 {
			t.Fatalf("round trip %d took %v", i, d)
		}
	}
	t0 := time.Now()
	if _, err := rpcBound(ctx, testLauncher("TestHelperRPCBoundPeerThatQuits"), 1<<20, 1, 5, 1); err == nil || !strings.Contains(err.Error(), "ended") {
		t.Fatalf("a second process that quits: %v, want it reported as ended", err)
	}
	if d := time.Since(t0); d > boundStall {
		t.Fatalf("noticing the second process had ended took %v", d)
	}
}
