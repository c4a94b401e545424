package rpc

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/tandemml/tandem/comm/store"
)

// startGroup starts n agents in this process over loopback sockets, meeting
// through an in-memory store. setup (may be nil) registers functions on
// rank r's registry before Init.
func startGroup(t testing.TB, n int, setup func(rank int, reg *Registry), opts ...Option) []*Agent {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	st := store.NewMemory()
	agents := mustInitEach(t, ctx, n, func(r int) (string, []Option) {
		reg := NewRegistry()
		if setup != nil {
			setup(r, reg)
		}
		return fmt.Sprintf("w%d", r), append([]Option{WithStore(st), WithRegistry(reg), WithListenAddr("127.0.0.1:0")}, opts...)
	})
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		var wg sync.WaitGroup
		for _, a := range agents {
			wg.Add(1)
			go func() {
				defer wg.Done()
				a.Shutdown(ctx, false)
			}()
		}
		wg.Wait()
		st.Close()
	})
	return agents
}

// initEach runs Init for every rank of a world of n at once (Init returns
// only once all have joined); setup gives rank r its name and options.
func initEach(ctx context.Context, n int, setup func(r int) (string, []Option)) ([]*Agent, []error) {
	agents := make([]*Agent, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for r := range n {
		name, opts := setup(r)
		wg.Go(func() { agents[r], errs[r] = Init(ctx, name, r, n, opts...) })
	}
	wg.Wait()
	return agents, errs
}

// mustInitEach is initEach that fails the test when a rank's Init fails.
func mustInitEach(t testing.TB, ctx context.Context, n int, setup func(r int) (string, []Option)) []*Agent {
	t.Helper()
	agents, errs := initEach(ctx, n, setup)
	for r, err := range errs {
		if err != nil {
			t.Fatalf("Init rank %d: %v", r, err)
		}
	}
	return agents
}

// basics returns a registry with registerBasics' functions for rank r.
func basics(r int) *Registry {
	reg := NewRegistry()
	registerBasics(r, reg)
	return reg
}

// shutdownAll shuts every agent down gracefully, concurrently, and returns
// their errors.
func shutdownAll(agents []*Agent) []error {
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
