package autograd

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"sync"

	"gorgonia.org/tensor"

	"github.com/tandemml/tandem/models"
	"github.com/tandemml/tandem/optim"
	"github.com/tandemml/tandem/rpc"
	"github.com/tandemml/tandem/rref"
)

// OptimizerConstructor builds an optimizer over params from settings (as
// optim.New takes them: torch.optim's keyword arguments, numbers as
// float64, lists as []any).
type OptimizerConstructor func(params []*models.Param, settings map[string]any) (optim.Optimizer, error)

var optimizers struct {
	mu    sync.Mutex
	ctors map[string]OptimizerConstructor
}

// RegisterOptimizer makes name build optimizers with ctor on this process's
// workers, for NewDistributedOptimizer. The names optim.New knows ("sgd",
// "adam", "adamw") need no registration. Call it from an init function (or
// before the agents start) on every worker that holds parameters;
// registering a name twice replaces the constructor.
func RegisterOptimizer(name string, ctor OptimizerConstructor) {
	optimizers.mu.Lock()
	defer optimizers.mu.Unlock()
	if optimizers.ctors == nil {
		optimizers.ctors = map[string]OptimizerConstructor{}
	}
	optimizers.ctors[name] = ctor
}

func optimizerConstructor(name string) OptimizerConstructor {
	optimizers.mu.Lock()
	defer optimizers.mu.Unlock()
	if c := optimizers.ctors[name]; c != nil {
		return c
	}
	return func(params []*models.Param, settings map[string]any) (optim.Optimizer, error) {
		return optim.New(name, params, settings)
	}
}

const (
	fnOptimNew = "autograd.optim.new"
)

type optimNewReq struct {
	Name     string
	Settings string // JSON
	Params   []*rref.RRef[*models.Param]
}

// remoteOptimizer is the optimizer a DistributedOptimizer keeps on one
// worker, over the parameters that worker holds.
type remoteOptimizer struct {
	agent  *rpc.Agent
	mu     sync.Mutex
	opt    optim.Optimizer
	params []*models.Param
}

func serveOptimNew(ctx context.Context, req optimNewReq) (*remoteOptimizer, error) {
	params := make([]*models.Param, len(req.Params))
	for i, ref := range req.Params {
		if ref == nil {
			return nil, fmt.Errorf("%w: autograd: parameter reference %d is nil", ErrInvalidArgument, i)
		}
		p, err := ref.LocalValue()
		if err != nil {
			return nil, fmt.Errorf("autograd: parameter reference %d: %w", i, err)
		}
		if p == nil {
			return nil, fmt.Errorf("%w: autograd: parameter reference %d holds nil", ErrInvalidArgument, i)
		}
		params[i] = p
	}
	var settings map[string]any
	if err := json.Unmarshal([]byte(req.Settings), &settings); err != nil {
		return nil, fmt.Errorf("%w: autograd: optimizer settings: %v", ErrInvalidArgument, err)
	}
	opt, err := optimizerConstructor(req.Name)(params, settings)
	if err != nil {
		return nil, err
	}
	a := rpc.AgentFromContext(ctx)
	if a == nil {
		return nil, fmt.Errorf("autograd: building an optimizer outside an agent")
	}
	return &remoteOptimizer{agent: a, opt: opt, params: params}, nil
}

// Check reports whether the optimizer exists (its constructor succeeded).
func (o *remoteOptimizer) Check() int { return len(o.params) }

// Step updates the parameters with the gradients of context id on this
// worker. Parameters without a gradient in the context are skipped.
func (o *remoteOptimizer) Step(ctx context.Context, id ContextID) error {
	a := o.agent
	m, err := managerOf(a)
	if err != nil {
		return err
	}
	c := m.lookup(id)
	if c == nil {
		return unknownContext(a, id)
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	// The optimizer reads Param.Grad: lend it the context's gradients for
	// the step, then put back whatever was there.
	saved := make([]*tensor.Dense, len(o.params))
	for i, p := range o.params {
		saved[i] = p.Grad
		p.Grad = c.gradOf(p)
	}
	err = o.opt.Step()
	for i, p := range o.params {
		p.Grad = saved[i]
	}
	return err
}

// DistributedOptimizer updates parameters that live on several workers with
// the gradients of a distributed autograd context (PyTorch's
// DistributedOptimizer): it builds one optimizer on each worker that holds
// some of the parameters, over those parameters, and Step steps them all in
// parallel, each with the gradients its worker accumulated in the context.
// Parameter updates happen where the parameters live; no gradient or
// parameter crosses the network.
type DistributedOptimizer struct {
	agent  *rpc.Agent
	name   string
	owners []rpc.WorkerInfo
	opts   []*rref.RRef[*remoteOptimizer]
}

// NewDistributedOptimizer builds, on every worker owning some of params,
// the optimizer called name (optim.New's "sgd", "adam", "adamw", or one
// added with RegisterOptimizer) over the parameters it owns, with settings
// in torch.optim's keyword form (e.g. {"lr": 0.05, "momentum": 0.9}).
// Parameter references come from RemoteModule.ParameterRRefs or
// rref.LocalRRef. Close releases the remote optimizers.
func NewDistributedOptimizer(ctx context.Context, a *rpc.Agent, name string, settings map[string]any, params []*rref.RRef[*models.Param]) (*DistributedOptimizer, error) {
	if len(params) == 0 {
		return nil, fmt.Errorf("%w: autograd: NewDistributedOptimizer with no parameters", ErrInvalidArgument)
	}
	js, err := json.Marshal(settings)
	if err != nil {
		return nil, fmt.Errorf("%w: autograd: optimizer settings: %v", ErrInvalidArgument, err)
	}
	byOwner := map[int][]*rref.RRef[*models.Param]{}
	for i, p := range params {
		if p == nil {
			return nil, fmt.Errorf("%w: autograd: parameter reference %d is nil", ErrInvalidArgument, i)
		}
		byOwner[p.Owner().ID] = append(byOwner[p.Owner().ID], p)
	}
	ids := make([]int, 0, len(byOwner))
	for w := range byOwner {
		ids = append(ids, w)
	}
	sort.Ints(ids)
	d := &DistributedOptimizer{agent: a, name: name}
	for _, w := range ids {
		info, err := a.WorkerByID(w)
		if err != nil {
			return nil, err
		}
		ref, err := rref.Remote[*remoteOptimizer](detach(ctx), a, info.Name, fnOptimNew, optimNewReq{Name: name, Settings: string(js), Params: byOwner[w]})
		if err != nil {
			d.Close(ctx)
			return nil, err
		}
		d.owners = append(d.owners, info)
		d.opts = append(d.opts, ref)
	}
	for i, ref := range d.opts {
		if _, err := rref.Call[int](detach(ctx), ref, "Check"); err != nil {
			d.Close(ctx)
			return nil, fmt.Errorf("autograd: building optimizer %q on worker %s: %w", name, d.owners[i], err)
		}
	}
	return d, nil
}

// Step updates every parameter with its gradient in context id, on every
// worker in parallel. Every worker holding parameters must have a part of
// the context (ErrUnknownContext otherwise, e.g. after the context ended).
func (d *DistributedOptimizer) Step(ctx context.Context, id ContextID) error {
	ctx = detach(ctx)
	errs := make([]error, len(d.opts))
	var wg sync.WaitGroup
	for i, ref := range d.opts {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := rref.Call[struct{}](ctx, ref, "Step", id); err != nil {
				errs[i] = fmt.Errorf("autograd: optimizer step on worker %s: %w", d.owners[i], err)
			}
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}

// Workers returns the workers that hold an optimizer, by id.
func (d *DistributedOptimizer) Workers() []rpc.WorkerInfo {
	return append([]rpc.WorkerInfo(nil), d.owners...)
}

// Close releases the remote optimizers (their state, such as momentum
// buffers, is freed once released).
func (d *DistributedOptimizer) Close(ctx context.Context) error {
	var errs []error
	for _, ref := range d.opts {
		if err := ref.Release(detach(ctx)); err != nil {
			errs = append(errs, err)
		}
	}
	d.opts, d.owners = nil, nil
	return errors.Join(errs...)
}
