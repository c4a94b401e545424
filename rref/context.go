package rref

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/tandemml/tandem/rpc"
)

// ID names an RRef, or one user's fork of it: the worker that made the id and
// a counter of that worker, so ids are unique in the group without
// coordination.
type ID struct {
	Worker int
	Seq    uint64
}

func (id ID) String() string { return fmt.Sprintf("%d:%d", id.Worker, id.Seq) }

func (id ID) isZero() bool { return id == ID{} }

// ctxKey is the agent extension key of the reference tables.
type ctxKey struct{}

// refContext is one worker's reference tables (PyTorch's RRefContext).
type refContext struct {
	agent *rpc.Agent

	mu  sync.Mutex
	seq uint64
	// owners: values this worker owns that other workers hold forks of.
	owners map[ID]*ownerEntry
	// users: user references on this worker not yet released, by fork id.
	users map[ID]*state
	// children: forks this worker sent to another worker and that are not
	// yet accepted, by the child's fork id, with the parent reference they
	// keep alive.
	children map[ID]*state
}

// ownerEntry is an owned value and the forks that users hold of it.
type ownerEntry struct {
	id    ID
	value *rpc.Future[any]
	forks map[ID]struct{}
	// tombs: forks whose delete arrived before their registration.
	tombs map[ID]struct{}
	// listed: the entry is in refContext.owners.
	listed bool
}

func newEntry(id ID) *ownerEntry {
	return &ownerEntry{id: id, value: rpc.NewFuture[any](), forks: map[ID]struct{}{}, tombs: map[ID]struct{}{}}
}

func init() { rpc.RegisterExtension("rref", attach) }

// attach installs the reference protocol on an agent.
func attach(a *rpc.Agent) error {
	rc := contextOf(a)
	if err := registerProtocol(a.Registry()); err != nil {
		return err
	}
	a.UseServer(rc.createInterceptor)
	a.OnShutdown(rc.onShutdown)
	return nil
}

// contextOf returns the agent's reference tables.
func contextOf(a *rpc.Agent) *refContext {
	return a.Extension(ctxKey{}, func() any {
		return &refContext{agent: a, owners: map[ID]*ownerEntry{}, users: map[ID]*state{}, children: map[ID]*state{}}
	}).(*refContext)
}

func (rc *refContext) newID() ID {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	rc.seq++
	return ID{Worker: rc.agent.Self().ID, Seq: rc.seq}
}

// entry returns the entry of id, creating a placeholder (listed) if the
// message that creates it has not arrived yet.
func (rc *refContext) entry(id ID) *ownerEntry {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	e := rc.owners[id]
	if e == nil {
		e = newEntry(id)
		e.listed = true
		rc.owners[id] = e
	}
	return e
}

// lookup returns the listed entry of id, or nil.
func (rc *refContext) lookup(id ID) *ownerEntry {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	return rc.owners[id]
}

// addFork registers a user's fork of e.
func (rc *refContext) addFork(e *ownerEntry, fork ID) {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	if !e.listed {
		e.listed = true
		rc.owners[e.id] = e
	}
	if _, dead := e.tombs[fork]; dead {
		delete(e.tombs, fork)
		rc.maybeDropLocked(e)
		return
	}
	e.forks[fork] = struct{}{}
}

// delFork removes a user's fork of the entry of id.
func (rc *refContext) delFork(id, fork ID) {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	e := rc.owners[id]
	if e == nil {
		// The delete overtook the creation: remember it.
		e = newEntry(id)
		e.listed = true
		rc.owners[id] = e
	}
	if _, ok := e.forks[fork]; !ok {
		e.tombs[fork] = struct{}{}
		return
	}
	delete(e.forks, fork)
	rc.maybeDropLocked(e)
}

// maybeDropLocked unlists an entry that no user holds any more and whose
// value is settled; owner handles on this worker keep the value alive.
func (rc *refContext) maybeDropLocked(e *ownerEntry) {
	if len(e.forks) > 0 || len(e.tombs) > 0 || !e.listed {
		return
	}
	if _, _, done := e.value.Result(); !done {
		return
	}
	e.listed = false
	delete(rc.owners, e.id)
}

// settled is called once an entry's value is complete.
func (rc *refContext) settled(e *ownerEntry) {
	rc.mu.Lock()
	rc.maybeDropLocked(e)
	rc.mu.Unlock()
}

// dropPlaceholder unlists a placeholder that nothing created, once the call
// that made it gave up waiting.
func (rc *refContext) dropPlaceholder(e *ownerEntry) {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	if _, _, done := e.value.Result(); done || len(e.forks) > 0 || len(e.tombs) > 0 || !e.listed {
		return
	}
	e.listed = false
	delete(rc.owners, e.id)
}

// OwnedCount returns how many values this worker owns on behalf of users
// (values only local owner handles hold are not counted).
func OwnedCount(a *rpc.Agent) int {
	rc := contextOf(a)
	rc.mu.Lock()
	defer rc.mu.Unlock()
	return len(rc.owners)
}

// UserCount returns how many user references this worker holds and has not
// released.
func UserCount(a *rpc.Agent) int {
	rc := contextOf(a)
	rc.mu.Lock()
	defer rc.mu.Unlock()
	return len(rc.users)
}

// ErrLeaked is reported (wrapped) by rpc.Agent.Shutdown when user references
// were still unreleased at shutdown.
var ErrLeaked = errors.New("rref: references leaked")

// onShutdown reports user references never released, as an error wrapping
// ErrLeaked (and a log line), and on a graceful shutdown releases them so
// that their owners free the values.
func (rc *refContext) onShutdown(ctx context.Context, graceful bool) error {
	rc.mu.Lock()
	var leaked []*state
	for _, st := range rc.users {
		leaked = append(leaked, st)
	}
	rc.mu.Unlock()
	if len(leaked) == 0 {
		return nil
	}
	sort.Slice(leaked, func(i, j int) bool {
		return leaked[i].fork.Seq < leaked[j].fork.Seq || leaked[i].fork.Seq == leaked[j].fork.Seq && leaked[i].fork.Worker < leaked[j].fork.Worker
	})
	var names []string
	for i, st := range leaked {
		if i == 10 {
			names = append(names, fmt.Sprintf("and %d more", len(leaked)-10))
			break
		}
		names = append(names, fmt.Sprintf("%s of %s owned by %s", st.typeName, st.id, st.owner.Name))
	}
	err := fmt.Errorf("%w: worker %s still held %d user reference(s) at shutdown (call Release when done): %s", ErrLeaked, rc.agent.Self(), len(leaked), strings.Join(names, "; "))
	rc.agent.Logger().Warn("rref: references leaked at shutdown", "worker", rc.agent.Self().Name, "count", len(leaked), "err", err)
	if graceful {
		var wg sync.WaitGroup
		for _, st := range leaked {
			wg.Add(1)
			go func() {
				defer wg.Done()
				st.release(ctx, true)
			}()
		}
		wg.Wait()
	}
	return err
}

// childTimeout bounds how long a parent keeps a child fork pending.
func (rc *refContext) childTimeout() time.Duration { return rc.agent.DefaultTimeout() }
