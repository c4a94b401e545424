package rpctest

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/tandemml/tandem/comm/store"
	"github.com/tandemml/tandem/internal/testkit"
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
	errs := testkit.EachRank(n, func(r int) (err error) {
		o := append([]rpc.Option{rpc.WithStore(st), rpc.WithRegistry(reg), rpc.WithListenAddr("127.0.0.1:0")}, opts...)
		agents[r], err = rpc.Init(ctx, fmt.Sprintf("w%d", r), r, n, o...)
		return err
	})
	for r, err := range errs {
		if err != nil {
			t.Fatalf("Init rank %d: %v", r, err)
		}
	}
	t.Cleanup(func() {
		testkit.EachRank(len(agents), func(r int) error { return agents[r].Close() })
		st.Close()
	})
	return agents
}

// ShutdownAll shuts every agent down gracefully and concurrently, bounded by
// 20 s, and returns their errors, one per agent in the same order.
func ShutdownAll(agents []*rpc.Agent) []error {
	ctx, cancel := context.WithTimeout(context.Background(), groupTimeout)
	defer cancel()
	return testkit.EachRank(len(agents), func(i int) error { return agents[i].Shutdown(ctx) })
}
