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
	// reported: the leaks were reported (by the shutdown hook).
	reported bool
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

// extensionName is rref's name among an agent's extensions.
const extensionName = "rref"

// Extension returns rref as an rpc extension: an agent installs the
// reference protocol only when asked,
//
//	rpc.Init(ctx, name, rank, world, rpc.WithExtensions(rref.Extension()))
//
// and every worker that creates, owns, sends or receives references must
// be asked (an agent without it fails rref's functions with
// rpc.ErrInvalidArgument saying so). Installing registers the protocol's
// functions in the agent's registry, a server interceptor that creates the
// values of Remote, and hooks that release (Shutdown) and report (Shutdown,
// Close) the references still held.
func Extension() rpc.Extension { return extension{} }

type extension struct{}

func (extension) Name() string { return extensionName }

// Install installs the reference protocol on a; the state is a's
// reference tables.
func (extension) Install(a *rpc.Agent) (any, error) {
	rc := &refContext{agent: a, owners: map[ID]*ownerEntry{}, users: map[ID]*state{}, children: map[ID]*state{}}
	if err := registerProtocol(a.Registry()); err != nil {
		return nil, err
	}
	a.UseServer(rc.createInterceptor)
	a.OnShutdown(rc.onShutdown)
	a.OnClose(rc.onClose)
	return rc, nil
}

// contextOf returns the agent's reference tables, or an error saying that
// the agent was started without rref.
func contextOf(a *rpc.Agent) (*refContext, error) {
	if a == nil {
		return nil, fmt.Errorf("%w: rref: no agent (nil *rpc.Agent)", rpc.ErrInvalidArgument)
	}
	v, ok := a.Extension(extensionName)
	if !ok {
		return nil, fmt.Errorf("%w: rref: worker %s was started without rref: pass rpc.WithExtensions(rref.Extension()) to rpc.Init on every worker", rpc.ErrInvalidArgument, a.Self())
	}
	return v.(*refContext), nil
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
// (values only local owner handles hold are not counted); 0 on an agent
// without rref.
func OwnedCount(a *rpc.Agent) int {
	rc, err := contextOf(a)
	if err != nil {
		return 0
	}
	rc.mu.Lock()
	defer rc.mu.Unlock()
	return len(rc.owners)
}

// UserCount returns how many user references this worker holds and has not
// released; 0 on an agent without rref.
func UserCount(a *rpc.Agent) int {
	rc, err := contextOf(a)
	if err != nil {
		return 0
	}
	rc.mu.Lock()
	defer rc.mu.Unlock()
	return len(rc.users)
}

// ErrLeaked is reported (wrapped) by rpc.Agent.Shutdown and Close when user
// references were still unreleased at shutdown.
var ErrLeaked = errors.New("rref: references leaked")

// onShutdown, at the start of a graceful shutdown, reports user references
// never released, as an error wrapping ErrLeaked (and a log line), and
// releases them so that their owners free the values.
func (rc *refContext) onShutdown(ctx context.Context) error {
	leaked, err := rc.leaks()
	if err == nil {
		return nil
	}
	var wg sync.WaitGroup
	for _, st := range leaked {
		wg.Add(1)
		go func() {
			defer wg.Done()
			st.release(ctx, true)
		}()
	}
	wg.Wait()
	return err
}

// onClose, when the agent closes, reports the user references never
// released, unless the shutdown hook has.
func (rc *refContext) onClose() error {
	_, err := rc.leaks()
	return err
}

// leaks lists the user references not released, and the error that
// reports them (once: nil when there are none or they were reported).
func (rc *refContext) leaks() ([]*state, error) {
	rc.mu.Lock()
	var leaked []*state
	for _, st := range rc.users {
		leaked = append(leaked, st)
	}
	if len(leaked) == 0 || rc.reported {
		rc.mu.Unlock()
		return nil, nil
	}
	rc.reported = true
	rc.mu.Unlock()
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
	return leaked, err
}

// childTimeout bounds how long a parent keeps a child fork pending.
func (rc *refContext) childTimeout() time.Duration { return rc.agent.DefaultTimeout() }
