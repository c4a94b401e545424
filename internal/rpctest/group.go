package rpctest

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/tandemml/tandem/comm/store"
	"github.com/tandemml/tandem/rpc"
)

// groupTimeout bounds both starting and shutting down a group.
const groupTimeout = 20 * time.Second

// StartGroup starts n agents, named w0 … w(n-1), in this process over
// loopback sockets (127.0.0.1, port 0), meeting through a fresh in-memory
// store. setup (may be nil) registers functions in the one registry every
// agent serves, before Init. opts come after the group's own options (store,
// registry, listen address), so they may replace them; extensions
// (rpc.WithExtensions(rref.Extension())) come with them. It fails the test
// if any rank cannot start within 20 s. A cleanup registered on t closes
// every agent (Close, concurrently) and the store; agents a test has
// already shut down are closed again harmlessly.
func StartGroup(t testing.TB, n int, setup func(reg *rpc.Registry), opts ...rpc.Option) []*rpc.Agent {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), groupTimeout)
	defer cancel()
	st := store.NewMemory()
	reg := rpc.NewRegistry()
	if setup != nil {
		setup(reg)
	}
	agents := make([]*rpc.Agent, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for r := 0; r < n; r++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			o := append([]rpc.Option{rpc.WithStore(st), rpc.WithRegistry(reg), rpc.WithListenAddr("127.0.0.1:0")}, opts...)
			agents[r], errs[r] = rpc.Init(ctx, fmt.Sprintf("w%d", r), r, n, o...)
		}()
	}
	wg.Wait()
	for r, err := range errs {
		if err != nil {
			t.Fatalf("Init rank %d: %v", r, err)
		}
	}
	t.Cleanup(func() {
		var wg sync.WaitGroup
		for _, a := range agents {
			wg.Add(1)
			go func() {
				defer wg.Done()
				a.Close()
			}()
		}
		wg.Wait()
		st.Close()
	})
	return agents
}

// ShutdownAll shuts every agent down gracefully and concurrently, bounded by
// 20 s, and returns their errors, one per agent in the same order.
func ShutdownAll(agents []*rpc.Agent) []error {
	ctx, cancel := context.WithTimeout(context.Background(), groupTimeout)
	defer cancel()
	errs := make([]error, len(agents))
	var wg sync.WaitGroup
	for i, a := range agents {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = a.Shutdown(ctx)
		}()
	}
	wg.Wait()
	return errs
}
