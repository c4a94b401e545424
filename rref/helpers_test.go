package rref

import (
	"testing"

	"github.com/tandemml/tandem/internal/rpctest"
	"github.com/tandemml/tandem/rpc"
)

// startGroup starts n agents with rpctest.StartGroup, with rref installed.
func startGroup(t testing.TB, n int, setup func(reg *rpc.Registry), opts ...rpc.Option) []*rpc.Agent {
	t.Helper()
	return rpctest.StartGroup(t, n, setup, append([]rpc.Option{rpc.WithExtensions(Extension())}, opts...)...)
}

// mustContext returns the agent's reference tables.
func mustContext(t testing.TB, a *rpc.Agent) *refContext {
	t.Helper()
	rc, err := contextOf(a)
	if err != nil {
		t.Fatal(err)
	}
	return rc
}

// forks returns the forks the owner has registered for id (-1: not listed).
func forks(a *rpc.Agent, id ID) int {
	rc, err := contextOf(a)
	if err != nil {
		return -1
	}
	rc.mu.Lock()
	defer rc.mu.Unlock()
	e := rc.owners[id]
	if e == nil {
		return -1
	}
	return len(e.forks)
}
