package autograd

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/tandemml/tandem/rpc"
	"github.com/tandemml/tandem/rref"
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

// extensionName is distributed autograd's name among an agent's
// extensions.
const extensionName = "autograd"

// Extension returns distributed autograd as an rpc extension: an agent
// installs it only when asked,
//
//	rpc.Init(ctx, name, rank, world, rpc.WithExtensions(autograd.Extension()))
//
// on every worker that takes part in a distributed backward pass (an agent
// without it fails this package's functions with ErrInvalidArgument saying
// so). It requires rref (RemoteModule and DistributedOptimizer hold remote
// references), which the agent then installs too. Installing registers the
// protocol's functions in the agent's registry, the client and server
// interceptors that record sends and receives, and a hook that drops every
// context when the agent closes.
func Extension() rpc.Extension { return extension{} }

type extension struct{}

func (extension) Name() string { return extensionName }

// Requires names the extensions autograd needs installed first: rref.
func (extension) Requires() []rpc.Extension { return []rpc.Extension{rref.Extension()} }

// Install installs distributed autograd on a; the state is a's manager.
func (extension) Install(a *rpc.Agent) (any, error) {
	m := &manager{agent: a, contexts: map[ContextID]*Context{}}
	if err := registerProtocol(a.Registry()); err != nil {
		return nil, err
	}
	a.UseClient(m.clientInterceptor)
	a.UseServer(m.serverInterceptor)
	a.OnClose(m.onClose)
	return m, nil
}

// managerOf returns the agent's distributed autograd state, or an error
// saying that the agent was started without it.
func managerOf(a *rpc.Agent) (*manager, error) {
	if a == nil {
		return nil, fmt.Errorf("%w: autograd: no agent (nil *rpc.Agent)", ErrInvalidArgument)
	}
	v, ok := a.Extension(extensionName)
	if !ok {
		return nil, fmt.Errorf("%w: autograd: worker %s was started without distributed autograd: pass rpc.WithExtensions(autograd.Extension()) to rpc.Init on every worker", ErrInvalidArgument, a.Self())
	}
	return v.(*manager), nil
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

// onClose drops every context when the agent closes. A graceful shutdown
// keeps serving until the whole group is idle, so contexts stay usable
// until then (their owners end them); what is left goes with the agent.
func (m *manager) onClose() error {
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
