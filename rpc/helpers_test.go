package rpc

import (
	"context"
	"fmt"
	"net"
	"testing"
	"time"

	"github.com/tandemml/tandem/comm/store"
	"github.com/tandemml/tandem/internal/testkit"
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
		testkit.EachRank(len(agents), func(r int) error { return agents[r].Close() })
		st.Close()
	})
	return agents
}

// initEach runs Init for every rank of a world of n at once (Init returns
// only once all have joined); setup gives rank r its name and options.
func initEach(ctx context.Context, n int, setup func(r int) (string, []Option)) ([]*Agent, []error) {
	agents := make([]*Agent, n)
	errs := testkit.EachRank(n, func(r int) (err error) {
		name, opts := setup(r)
		agents[r], err = Init(ctx, name, r, n, opts...)
		return err
	})
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
	return testkit.EachRank(len(agents), func(i int) error { return agents[i].Shutdown(ctx) })
}

// masterStore starts a TCP store master on a free port of 127.0.0.1 that
// asks for token, closed when the test ends, and returns it and its port,
// for worker processes to reach as MASTER_ADDR and MASTER_PORT.
func masterStore(t *testing.T, ctx context.Context, token string) (*store.TCPStore, string) {
	t.Helper()
	st, err := store.NewTCP(ctx, "127.0.0.1:0", true, store.WithToken(token))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	_, port, _ := net.SplitHostPort(st.Addr())
	return st, port
}
