package autograd

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/tandemml/tandem/rpc"
)

// manager is one agent's distributed autograd state: its contexts and the
// counters its ids come from (PyTorch's DistAutogradContainer).
type manager struct {
	agent    *rpc.Agent
	mu       sync.Mutex
	seq      uint64
	contexts map[ContextID]*Context
	closed   bool
	msgSeq   atomic.Uint64
	modules  map[uint64]*ModuleHost // built for RemoteModules, by id
}

type managerKey struct{}

func init() { rpc.RegisterExtension("autograd", attach) }

// attach installs distributed autograd on an agent: the protocol's
// functions, the interceptors that record sends and receives, and a
// shutdown hook that drops every context.
func attach(a *rpc.Agent) error {
	m := managerOf(a)
	if err := registerProtocol(a.Registry()); err != nil {
		return err
	}
	a.UseClient(m.clientInterceptor)
	a.UseServer(m.serverInterceptor)
	a.OnShutdown(m.onShutdown)
	return nil
}

func managerOf(a *rpc.Agent) *manager {
	return a.Extension(managerKey{}, func() any {
		return &manager{agent: a, contexts: map[ContextID]*Context{}}
	}).(*manager)
}

// newMsgID returns an id for a send function, unique in the group.
func (m *manager) newMsgID() uint64 {
	return makeID(m.agent.Self().ID, m.msgSeq.Add(1))
}

func (m *manager) lookup(id ContextID) *Context {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.contexts[id]
}

// join returns this worker's part of context id, creating it when an RPC of
// the context first reaches the worker.
func (m *manager) join(id ContextID) (*Context, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return nil, fmt.Errorf("%w: autograd: agent %s is shut down", ErrClosed, m.agent.Self())
	}
	if c := m.contexts[id]; c != nil {
		return c, nil
	}
	if id.Worker() == m.agent.Self().ID {
		return nil, unknownContext(m.agent, id)
	}
	c := newContext(m, id, false)
	m.contexts[id] = c
	return c, nil
}

// drop removes c from the table and fails its passes with cause. It returns
// the workers a release must reach, and whether this call did the removal.
func (m *manager) drop(c *Context, cause error) ([]int, bool) {
	m.mu.Lock()
	if m.contexts[c.id] == c {
		delete(m.contexts, c.id)
	}
	m.mu.Unlock()
	c.mu.Lock()
	if c.released {
		c.mu.Unlock()
		return nil, false
	}
	c.released = true
	targets := c.releaseTargetsLocked()
	passes := make([]*pass, 0, len(c.passes))
	for _, p := range c.passes {
		passes = append(passes, p)
	}
	c.mu.Unlock()
	for _, p := range passes {
		p.fail(cause)
	}
	return targets, true
}

// releaseOn tells workers to drop their part of context id, in parallel.
func (m *manager) releaseOn(ctx context.Context, id ContextID, workers []int) error {
	ctx = detach(ctx)
	errs := make([]error, len(workers))
	var wg sync.WaitGroup
	for i, w := range workers {
		info, err := m.agent.WorkerByID(w)
		if err != nil {
			errs[i] = err
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := rpc.Sync[struct{}](ctx, m.agent, info.Name, fnRelease, releaseMsg{Ctx: uint64(id)})
			if err != nil {
				errs[i] = fmt.Errorf("autograd: releasing context %s on worker %s: %w", id, info, err)
			}
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}

// onShutdown drops every context when the agent stops at once. A graceful
// shutdown keeps serving until the whole group is idle, so contexts stay
// usable (their owners end them); what is left goes with the agent.
func (m *manager) onShutdown(ctx context.Context, graceful bool) error {
	if graceful {
		return nil
	}
	m.mu.Lock()
	m.closed = true
	m.modules = nil
	cs := make([]*Context, 0, len(m.contexts))
	for _, c := range m.contexts {
		cs = append(cs, c)
	}
	m.mu.Unlock()
	for _, c := range cs {
		m.drop(c, fmt.Errorf("%w: autograd: agent %s is shutting down", ErrClosed, m.agent.Self()))
	}
	return nil
}
