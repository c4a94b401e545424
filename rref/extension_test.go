package rref

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/tandemml/tandem/internal/rpctest"
	"github.com/tandemml/tandem/rpc"
)

// An agent started without rref serves none of it, and rref's functions
// fail on it saying how to install it; with rref installed on one side
// only, the other side's refusal names the missing function.
func TestWithoutExtension(t *testing.T) {
	agents := rpctest.StartGroup(t, 2, setup(holders(2)))
	ctx := context.Background()
	if _, ok := agents[0].Extension("rref"); ok {
		t.Fatal("rref is installed on an agent that was not given it")
	}
	_, err := Remote[*Counter](ctx, agents[0], "w1", "counter", 1)
	if !errors.Is(err, rpc.ErrInvalidArgument) || !strings.Contains(err.Error(), "rpc.WithExtensions(rref.Extension())") {
		t.Fatalf("Remote without rref: %v", err)
	}
	var ce *rpc.CallError
	if !errors.As(err, &ce) || ce.Op != "remote" || ce.Func != "counter" {
		t.Fatalf("Remote without rref: not the call's *rpc.CallError: %#v", err)
	}
	if _, err := LocalRRef(agents[0], 1); !errors.Is(err, rpc.ErrInvalidArgument) {
		t.Fatalf("LocalRRef without rref: %v", err)
	}
	if n := OwnedCount(agents[0]); n != 0 {
		t.Fatalf("OwnedCount without rref: %d", n)
	}
	if agents[0].Registry().Has(fnFetch) {
		t.Fatal("the protocol is registered on an agent without rref")
	}
}

// Two groups in one process share a registry; both install rref on it.
func TestExtensionSharedRegistry(t *testing.T) {
	reg := rpc.NewRegistry()
	setup(holders(2))(reg)
	for range 2 {
		agents := startGroup(t, 2, func(r *rpc.Registry) {}, rpc.WithRegistry(reg))
		ctx := context.Background()
		ref, err := Remote[*Counter](ctx, agents[0], "w1", "counter", 3)
		if err != nil {
			t.Fatal(err)
		}
		if c, err := ref.ToHere(ctx); err != nil || c.N != 3 {
			t.Fatalf("ToHere: %+v %v", c, err)
		}
		if err := ref.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
}

// Errors of ToHere and Call are *rpc.CallError naming the operation.
func TestCallErrorOps(t *testing.T) {
	agents := startGroup(t, 2, setup(holders(2)))
	ctx := context.Background()
	ref, err := Remote[*Counter](ctx, agents[0], "w1", "counter", 1)
	if err != nil {
		t.Fatal(err)
	}
	defer ref.Release(ctx)
	var ce *rpc.CallError
	if _, err := Call[struct{}](ctx, ref, "Fail"); !errors.As(err, &ce) || ce.Op != "call" || ce.Peer != "w1" || ce.Func != "Fail" || !errors.Is(err, rpc.ErrRemote) {
		t.Fatalf("Call: %v", err)
	}
	bad, err := Remote[*Counter](ctx, agents[0], "w1", "nothing", 1)
	if err != nil {
		t.Fatal(err)
	}
	defer bad.Release(ctx)
	if _, err := bad.ToHere(ctx); !errors.As(err, &ce) || ce.Op != "to_here" || ce.Peer != "w1" || ce.Func != "nothing" || !errors.Is(err, rpc.ErrUnknownFunction) {
		t.Fatalf("ToHere of a failed creation: %v", err)
	}
}
