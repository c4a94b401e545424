package autograd

import (
	"context"
	"errors"
	"fmt"

	"gorgonia.org/tensor"

	"github.com/tandemml/tandem/models"
	"github.com/tandemml/tandem/rpc"
	"github.com/tandemml/tandem/rref"
)

const (
	fnModuleForward = "autograd.module.forward"
	fnModuleDrop    = "autograd.module.drop"
	metaModule      = "autograd-module" // the id a new module is filed under
)

// ModuleHost is a module living on the worker that built it for a
// RemoteModule: the module and the Function that applies it. Its worker
// files it under an id, so that forward calls name it with a number (an
// RRef to it serves for its parameters and its lifetime).
type ModuleHost struct {
	agent  *rpc.Agent
	id     uint64
	module models.Module
	fn     *Function
}

type moduleIDKey struct{}

// Module returns the hosted module (on its worker).
func (h *ModuleHost) Module() models.Module { return h.module }

// ParamNames returns the module's parameter names in state_dict order.
func (h *ModuleHost) ParamNames() []string {
	ps := h.module.Params()
	out := make([]string, len(ps))
	for i, p := range ps {
		out[i] = p.Name
	}
	return out
}

// Stats returns the counters of the Function that applies the module.
func (h *ModuleHost) Stats() FunctionStats { return h.fn.Stats() }

// ParameterRRefs returns owner references to the module's learnable
// parameters, in order (sent to the caller, they become its references).
func (h *ModuleHost) ParameterRRefs(ctx context.Context) ([]*rref.RRef[*models.Param], error) {
	a := h.agent
	if a == nil {
		return nil, fmt.Errorf("autograd: ParameterRRefs of a module not built by an agent")
	}
	var out []*rref.RRef[*models.Param]
	for _, p := range h.module.Params() {
		if p.RequiresGrad {
			ref, err := rref.LocalRRef(a, p)
			if err != nil {
				return nil, err
			}
			out = append(out, ref)
		}
	}
	return out, nil
}

// RegisterModule registers under name a function that builds a module from
// a configuration of type C, for NewRemoteModule. Register it in the
// registry of every worker that may host such modules, before Init. opts
// configure the Function that applies the module (Workers, WithMode).
func RegisterModule[C any](r rpc.Registrar, name string, ctor func(ctx context.Context, cfg C) (models.Module, error), opts ...FunctionOption) error {
	if ctor == nil {
		return fmt.Errorf("%w: autograd: RegisterModule(%q) with a nil constructor", ErrInvalidArgument, name)
	}
	return rpc.Register(r, name, func(ctx context.Context, cfg C) (*ModuleHost, error) {
		m, err := ctor(ctx, cfg)
		if err != nil {
			return nil, err
		}
		if m == nil {
			return nil, fmt.Errorf("%w: autograd: module constructor %q returned nil", ErrInvalidArgument, name)
		}
		h := &ModuleHost{module: m, fn: NewModuleFunction(name, m, opts...)}
		id, ok := ctx.Value(moduleIDKey{}).(uint64) // a call to this worker itself
		if !ok {
			id, _ = parseUint(rpc.MetadataFromContext(ctx)[metaModule])
		}
		h.agent = rpc.AgentFromContext(ctx)
		if h.agent != nil && id != 0 {
			m, err := managerOf(h.agent)
			if err != nil {
				return nil, err
			}
			h.id = id
			m.addModule(h)
		}
		return h, nil
	})
}

func (m *manager) addModule(h *ModuleHost) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.modules == nil {
		m.modules = map[uint64]*ModuleHost{}
	}
	m.modules[h.id] = h
}

func (m *manager) module(id uint64) (*ModuleHost, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if h := m.modules[id]; h != nil {
		return h, nil
	}
	return nil, fmt.Errorf("%w: autograd: worker %s has no module %s (closed, or not built with NewRemoteModule)", ErrInvalidArgument, m.agent.Self(), msgString(id))
}

type moduleForwardReq struct {
	Module uint64
	X      *tensor.Dense
}

func serveModuleForward(ctx context.Context, req moduleForwardReq) (*tensor.Dense, error) {
	m, err := handlerManager(ctx)
	if err != nil {
		return nil, err
	}
	if req.X == nil {
		return nil, fmt.Errorf("%w: autograd: module forward needs an input", ErrInvalidArgument)
	}
	h, err := m.module(req.Module)
	if err != nil {
		return nil, err
	}
	outs, err := h.fn.Apply(ctx, FromContext(ctx), req.X)
	if err != nil {
		return nil, err
	}
	return outs[0], nil
}

func serveModuleDrop(ctx context.Context, id uint64) (struct{}, error) {
	m, err := handlerManager(ctx)
	if err != nil {
		return struct{}{}, err
	}
	m.mu.Lock()
	delete(m.modules, id)
	m.mu.Unlock()
	return struct{}{}, nil
}

// RemoteModule is a module built on another worker (PyTorch's
// RemoteModule): its parameters stay there, Forward runs it there through
// an RPC (recorded in the distributed autograd context, so Backward reaches
// its parameters), and its parameters are reachable as RRefs for a
// DistributedOptimizer.
type RemoteModule struct {
	agent  *rpc.Agent
	worker rpc.WorkerInfo
	ref    *rref.RRef[*ModuleHost]
	id     uint64
}

// NewRemoteModule builds a module on worker with the constructor registered
// there under ctor (RegisterModule) from cfg, and waits until it exists (so
// a constructor's error comes back here).
func NewRemoteModule(ctx context.Context, a *rpc.Agent, worker, ctor string, cfg any) (*RemoteModule, error) {
	info, err := a.WorkerInfo(worker)
	if err != nil {
		return nil, err
	}
	m, err := managerOf(a)
	if err != nil {
		return nil, err
	}
	id := m.newMsgID()
	ctx = context.WithValue(detach(ctx), moduleIDKey{}, id)
	ref, err := rref.Remote[*ModuleHost](ctx, a, worker, ctor, cfg, rpc.WithMetadata(rpc.Metadata{metaModule: formatUint(id)}))
	if err != nil {
		return nil, err
	}
	rm := &RemoteModule{agent: a, worker: info, ref: ref, id: id}
	if _, err := rref.Call[[]string](ctx, ref, "ParamNames"); err != nil {
		rm.Close(ctx)
		return nil, fmt.Errorf("autograd: building module %q on worker %s: %w", ctor, info, err)
	}
	return rm, nil
}

// Worker returns the worker the module lives on.
func (m *RemoteModule) Worker() rpc.WorkerInfo { return m.worker }

// Forward applies the module to x on its worker. With a context (c not nil)
// the call is recorded in c, so c.Backward reaches the module's parameters
// and, if x is tracked, flows back to x; with c nil it only computes.
func (m *RemoteModule) Forward(ctx context.Context, c *Context, x *tensor.Dense, opts ...rpc.CallOption) (*tensor.Dense, error) {
	return m.ForwardAsync(ctx, c, x, opts...).Wait(ctx)
}

// ForwardAsync starts Forward and returns its future at once: micro-batches
// sent this way queue on the module's worker while the caller goes on, so
// the stages of a pipeline overlap.
func (m *RemoteModule) ForwardAsync(ctx context.Context, c *Context, x *tensor.Dense, opts ...rpc.CallOption) *rpc.Future[*tensor.Dense] {
	if c != nil {
		ctx = NewContextWithAutograd(ctx, c)
	} else {
		ctx = detach(ctx)
	}
	return rpc.Async[*tensor.Dense](ctx, m.agent, m.worker.Name, fnModuleForward, moduleForwardReq{Module: m.id, X: x}, opts...)
}

// ParameterRRefs returns references to the module's learnable parameters,
// in state_dict order, for NewDistributedOptimizer (release them when
// done).
func (m *RemoteModule) ParameterRRefs(ctx context.Context) ([]*rref.RRef[*models.Param], error) {
	return rref.Call[[]*rref.RRef[*models.Param]](detach(ctx), m.ref, "ParameterRRefs")
}

// Stats returns the runs and busy time of the module on its worker.
func (m *RemoteModule) Stats(ctx context.Context) (FunctionStats, error) {
	return rref.Call[FunctionStats](detach(ctx), m.ref, "Stats")
}

// ParamNames returns the module's parameter names, in state_dict order.
func (m *RemoteModule) ParamNames(ctx context.Context) ([]string, error) {
	return rref.Call[[]string](detach(ctx), m.ref, "ParamNames")
}

// Close releases the module: its worker stops serving Forward for it and
// frees it once no reference (such as a parameter RRef) remains.
func (m *RemoteModule) Close(ctx context.Context) error {
	ctx = detach(ctx)
	_, err := rpc.Sync[struct{}](ctx, m.agent, m.worker.Name, fnModuleDrop, m.id)
	if err != nil {
		err = fmt.Errorf("autograd: closing the module on worker %s: %w", m.worker, err)
	}
	return errors.Join(err, m.ref.Release(ctx))
}
