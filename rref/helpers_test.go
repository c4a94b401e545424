package rref

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/tandemml/tandem/comm/store"
	"github.com/tandemml/tandem/rpc"
)

// startGroup starts n agents in this process over loopback sockets.
func startGroup(t testing.TB, n int, setup func(reg *rpc.Registry), opts ...rpc.Option) []*rpc.Agent {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
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
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		for _, a := range agents {
			a.Shutdown(ctx, false)
		}
		st.Close()
	})
	return agents
}

func shutdownAll(agents []*rpc.Agent) []error {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	errs := make([]error, len(agents))
	var wg sync.WaitGroup
	for i, a := range agents {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = a.Shutdown(ctx, true)
		}()
	}
	wg.Wait()
	return errs
}

// eventually polls cond until it holds or 10 s pass.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting until %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// forks returns the forks the owner has registered for id (-1: not listed).
func forks(a *rpc.Agent, id ID) int {
	rc := contextOf(a)
	rc.mu.Lock()
	defer rc.mu.Unlock()
	e := rc.owners[id]
	if e == nil {
		return -1
	}
	return len(e.forks)
}
