package rref

import "github.com/tandemml/tandem/rpc"

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
