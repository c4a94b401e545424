package autograd

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	G "gorgonia.org/gorgonia"
	"gorgonia.org/tensor"

	"github.com/tandemml/tandem/graph"
	"github.com/tandemml/tandem/models"
)

// BuildFunc adds a computation to b's graph: given input nodes (one per
// input tensor, with its shape and dtype) it returns the output nodes.
// Parameters enter through b.Node(param) (modules do this in Forward), so
// that their gradients are found. It must build the same computation every
// time it is called: a Function calls it once for the forward graph and
// once for the backward graph of each input signature.
type BuildFunc func(b *models.Builder, inputs []*G.Node) ([]*G.Node, error)

// Function is a differentiable computation on one worker, written as a
// gorgonia graph, that records itself in a distributed autograd context
// when applied: the local piece of a distributed graph (a pipeline stage,
// a loss). It compiles, per input signature (shapes and dtypes), a forward
// program and, on the first backward pass, a backward program that runs
// the forward again and then its vector-Jacobian product. So between the
// forward and the backward pass it keeps only its inputs, never its
// activations (re-materialization, as GPipe does), and one Function serves
// any number of micro-batches in flight. Runs of the forward program are
// serialized, and so are runs of the backward program, but a forward may
// run while a backward does.
//
// The computation must be deterministic (no Dropout, no batch statistics
// updated in Train mode): the backward pass recomputes the forward and
// must see the same values. Parameters must not change between a forward
// and its backward pass.
//
// A Function is safe for concurrent use.
type Function struct {
	name  string
	build BuildFunc
	cfg   fnConfig

	mu   sync.Mutex
	sigs map[string]*signature

	fwdRuns, fwdNanos atomic.Int64
	bwdRuns, bwdNanos atomic.Int64
}

// FunctionStats counts a Function's runs and the wall-clock time they took
// (compilation excluded). A pipeline stage's busy time over a step's time
// is its utilization; the rest is the pipeline's bubble.
type FunctionStats struct {
	ForwardRuns, BackwardRuns int64
	Forward, Backward         time.Duration
}

// Busy returns the time spent in forward and backward runs.
func (s FunctionStats) Busy() time.Duration { return s.Forward + s.Backward }

// Stats returns the function's counters since it was made.
func (f *Function) Stats() FunctionStats {
	return FunctionStats{
		ForwardRuns: f.fwdRuns.Load(), BackwardRuns: f.bwdRuns.Load(),
		Forward: time.Duration(f.fwdNanos.Load()), Backward: time.Duration(f.bwdNanos.Load()),
	}
}

// FunctionOption configures a Function.
type FunctionOption func(*fnConfig)

type fnConfig struct {
	workers int
	mode    models.Mode
}

// GraphWorkers sets how many graph nodes the function's programs may run at
// once (package graph's Workers; default 1, deterministic: a pipeline gets
// its parallelism from its stages).
func GraphWorkers(n int) FunctionOption {
	return func(c *fnConfig) {
		if n > 0 {
			c.workers = n
		}
	}
}

// WithMode builds the graph in the given mode (models.Train by default).
func WithMode(m models.Mode) FunctionOption { return func(c *fnConfig) { c.mode = m } }

// NewFunction returns a Function named name (for error messages) that
// builds its graph with build.
func NewFunction(name string, build BuildFunc, opts ...FunctionOption) *Function {
	cfg := fnConfig{workers: 1}
	for _, o := range opts {
		if o != nil {
			o(&cfg)
		}
	}
	return &Function{name: name, build: build, cfg: cfg, sigs: map[string]*signature{}}
}

// NewModuleFunction returns a Function of one input that applies module m.
func NewModuleFunction(name string, m models.Module, opts ...FunctionOption) *Function {
	return NewFunction(name, func(b *models.Builder, in []*G.Node) ([]*G.Node, error) {
		if len(in) != 1 {
			return nil, fmt.Errorf("%w: autograd: module function %q takes one input, got %d", ErrInvalidArgument, name, len(in))
		}
		y, err := m.Forward(b, in[0])
		if err != nil {
			return nil, err
		}
		return []*G.Node{y}, nil
	}, opts...)
}

// Name returns the function's name.
func (f *Function) Name() string { return f.name }

// signature is what a Function compiled for one list of input shapes.
type signature struct {
	key    string
	shapes []tensor.Shape
	dtypes []tensor.Dtype

	fwdMu   sync.Mutex
	fwd     *graph.Program
	fwdIn   []*G.Node
	fwdOut  []*G.Node
	params  []*models.Param // learnable parameters the graph binds
	outMeta []outMeta

	bmu sync.Mutex
	bwd map[string]*backwardProgram // by mask of inputs needing a gradient
}

type outMeta struct {
	shape tensor.Shape
	dtype tensor.Dtype
}

type backwardProgram struct {
	mu      sync.Mutex
	prog    *graph.Program
	in      []*G.Node
	gy      []*G.Node
	params  []*models.Param // parameters with a gradient node
	pgrads  []*G.Node
	ingrads []*G.Node // parallel to inputs; nil: no gradient wanted or none exists
}

func sigKey(inputs []*tensor.Dense) string {
	var b strings.Builder
	for _, t := range inputs {
		fmt.Fprintf(&b, "%v%v;", t.Dtype(), t.Shape())
	}
	return b.String()
}

func (f *Function) signature(inputs []*tensor.Dense) (*signature, error) {
	key := sigKey(inputs)
	f.mu.Lock()
	defer f.mu.Unlock()
	if s := f.sigs[key]; s != nil {
		return s, nil
	}
	s := &signature{key: key, bwd: map[string]*backwardProgram{}}
	for _, t := range inputs {
		s.shapes = append(s.shapes, t.Shape().Clone())
		s.dtypes = append(s.dtypes, t.Dtype())
	}
	b := models.NewBuilder(nil, models.WithMode(f.cfg.mode))
	s.fwdIn = s.inputNodes(b)
	outs, err := f.build(b, s.fwdIn)
	if err != nil {
		return nil, fmt.Errorf("autograd: building function %q: %w", f.name, err)
	}
	if len(outs) == 0 {
		return nil, fmt.Errorf("%w: autograd: function %q has no outputs", ErrInvalidArgument, f.name)
	}
	for i, o := range outs {
		if o == nil {
			return nil, fmt.Errorf("%w: autograd: function %q: output %d is nil", ErrInvalidArgument, f.name, i)
		}
		if !isFloat(o.Dtype()) {
			return nil, fmt.Errorf("%w: autograd: function %q: output %d is %v; outputs must be float32 or float64", ErrInvalidArgument, f.name, i, o.Dtype())
		}
		s.outMeta = append(s.outMeta, outMeta{shape: o.Shape().Clone(), dtype: o.Dtype()})
	}
	s.fwdOut = outs
	s.params = b.Params()
	opts := []graph.Option{graph.Workers(f.cfg.workers)}
	if f.cfg.mode == models.Eval {
		opts = append(opts, graph.EvalMode())
	}
	if s.fwd, err = graph.Compile(b.Graph(), opts...); err != nil {
		return nil, fmt.Errorf("autograd: compiling function %q: %w", f.name, err)
	}
	f.sigs[key] = s
	return s, nil
}

// inputNodes binds one input node per input, holding a zero tensor of its
// shape until a run binds the real one.
func (s *signature) inputNodes(b *models.Builder) []*G.Node {
	nodes := make([]*G.Node, len(s.shapes))
	for i, sh := range s.shapes {
		name := fmt.Sprintf("input%d", i)
		if len(sh) == 0 {
			nodes[i] = G.NewScalar(b.Graph(), s.dtypes[i], G.WithName(name))
			continue
		}
		nodes[i] = b.Bind(name, tensor.New(tensor.Of(s.dtypes[i]), tensor.WithShape(sh.Clone()...)))
	}
	return nodes
}

func bindInputs(nodes []*G.Node, inputs []*tensor.Dense) []graph.Binding {
	bs := make([]graph.Binding, len(nodes))
	for i, n := range nodes {
		bs[i] = graph.Bind(n, bindable(inputs[i], len(n.Shape()) == 0))
	}
	return bs
}

// Apply runs the function on inputs and returns new output tensors. With a
// context (c not nil) it records itself there when any input is tracked or
// the graph reads a learnable parameter, so that Backward reaches it: the
// outputs are then tracked, and sending them through an RPC or passing them
// to another Function extends the graph. Without a context it only
// computes (inference).
func (f *Function) Apply(ctx context.Context, c *Context, inputs ...*tensor.Dense) ([]*tensor.Dense, error) {
	for i, t := range inputs {
		if t == nil {
			return nil, fmt.Errorf("%w: autograd: function %q: input %d is nil", ErrInvalidArgument, f.name, i)
		}
	}
	s, err := f.signature(inputs)
	if err != nil {
		return nil, err
	}
	outs, err := s.forward(ctx, f, inputs)
	if err != nil {
		return nil, err
	}
	if c == nil {
		return outs, nil
	}
	need := make([]bool, len(inputs))
	any := len(s.params) > 0
	for i, t := range inputs {
		need[i] = isFloat(t.Dtype()) && c.Tracked(t)
		any = any || need[i]
	}
	if !any {
		return outs, nil
	}
	saved := append([]*tensor.Dense(nil), inputs...)
	backward := func(ctx context.Context, gys []*tensor.Dense) ([]*tensor.Dense, error) {
		return f.backward(ctx, c, s, need, saved, gys)
	}
	if err := c.Record(f.name, inputs, outs, backward); err != nil {
		return nil, err
	}
	return outs, nil
}

func (s *signature) forward(ctx context.Context, f *Function, inputs []*tensor.Dense) ([]*tensor.Dense, error) {
	name := f.name
	s.fwdMu.Lock()
	defer s.fwdMu.Unlock()
	start := time.Now()
	defer func() { f.fwdRuns.Add(1); f.fwdNanos.Add(int64(time.Since(start))) }()
	if err := s.fwd.Run(ctx, bindInputs(s.fwdIn, inputs)...); err != nil {
		return nil, fmt.Errorf("autograd: forward of %q: %w", name, err)
	}
	outs := make([]*tensor.Dense, len(s.fwdOut))
	for i, n := range s.fwdOut {
		v, err := valueDense(s.fwd.Value(n), s.outMeta[i].shape)
		if err != nil {
			return nil, fmt.Errorf("autograd: forward of %q, output %d: %w", name, i, err)
		}
		outs[i] = v
	}
	return outs, nil
}

func maskKey(need []bool) string {
	b := make([]byte, len(need))
	for i, n := range need {
		b[i] = '0'
		if n {
			b[i] = '1'
		}
	}
	return string(b)
}

// backwardProgram compiles (once per mask) the graph that recomputes the
// forward and differentiates sum_k <output_k, gy_k> with respect to the
// parameters and the inputs marked in need.
func (f *Function) backwardProgram(s *signature, need []bool) (*backwardProgram, error) {
	key := maskKey(need)
	s.bmu.Lock()
	defer s.bmu.Unlock()
	if bp := s.bwd[key]; bp != nil {
		return bp, nil
	}
	b := models.NewBuilder(nil, models.WithMode(f.cfg.mode))
	bp := &backwardProgram{in: s.inputNodes(b)}
	outs, err := f.build(b, bp.in)
	if err != nil {
		return nil, fmt.Errorf("autograd: building the backward graph of %q: %w", f.name, err)
	}
	if len(outs) != len(s.outMeta) {
		return nil, fmt.Errorf("autograd: function %q built %d outputs, then %d: its build function must be deterministic", f.name, len(s.outMeta), len(outs))
	}
	var cost *G.Node
	for k, o := range outs {
		var gy *G.Node
		if len(o.Shape()) == 0 {
			gy = G.NewScalar(b.Graph(), o.Dtype(), G.WithName(fmt.Sprintf("grad_output%d", k)))
		} else {
			gy = b.Bind(fmt.Sprintf("grad_output%d", k), tensor.New(tensor.Of(o.Dtype()), tensor.WithShape(o.Shape().Clone()...)))
		}
		bp.gy = append(bp.gy, gy)
		term, err := G.HadamardProd(o, gy)
		if err != nil {
			return nil, fmt.Errorf("autograd: backward graph of %q: %w", f.name, err)
		}
		if len(term.Shape()) > 0 {
			if term, err = G.Sum(term); err != nil {
				return nil, fmt.Errorf("autograd: backward graph of %q: %w", f.name, err)
			}
		}
		if cost == nil {
			cost = term
		} else if cost, err = G.Add(cost, term); err != nil {
			return nil, fmt.Errorf("autograd: backward graph of %q: %w", f.name, err)
		}
	}
	params := b.Params()
	wrt := append(G.Nodes(nil), b.ParamNodes()...)
	for i, n := range bp.in {
		if need[i] {
			wrt = append(wrt, n)
		}
	}
	grads, kept, err := gradDropUnused(cost, wrt)
	if err != nil {
		return nil, fmt.Errorf("autograd: differentiating %q: %w", f.name, err)
	}
	gradOf := map[*G.Node]*G.Node{}
	for i, n := range kept {
		gradOf[n] = grads[i]
	}
	for i, n := range b.ParamNodes() {
		if g := gradOf[n]; g != nil {
			bp.params = append(bp.params, params[i])
			bp.pgrads = append(bp.pgrads, g)
		}
	}
	bp.ingrads = make([]*G.Node, len(bp.in))
	for i, n := range bp.in {
		if need[i] {
			bp.ingrads[i] = gradOf[n]
		}
	}
	opts := []graph.Option{graph.Workers(f.cfg.workers)}
	if len(kept) > 0 {
		opts = append(opts, graph.WithGrads(kept, grads))
	}
	if f.cfg.mode == models.Eval {
		opts = append(opts, graph.EvalMode())
	}
	if bp.prog, err = graph.Compile(b.Graph(), opts...); err != nil {
		return nil, fmt.Errorf("autograd: compiling the backward graph of %q: %w", f.name, err)
	}
	s.bwd[key] = bp
	return bp, nil
}

// gradDropUnused differentiates cost with respect to wrt, leaving out the
// nodes cost does not depend on (gorgonia refuses those).
func gradDropUnused(cost *G.Node, wrt G.Nodes) (grads, kept G.Nodes, err error) {
	kept = append(G.Nodes(nil), wrt...)
	for len(kept) > 0 {
		grads, err = G.Grad(cost, kept...)
		if err == nil {
			return grads, kept, nil
		}
		var sde G.SymDiffError
		if !errors.As(err, &sde) || len(sde.Nodes()) == 0 {
			return nil, nil, err
		}
		unused := map[*G.Node]bool{}
		for _, n := range sde.Nodes() {
			unused[n] = true
		}
		next := kept[:0:0]
		for _, n := range kept {
			if !unused[n] {
				next = append(next, n)
			}
		}
		if len(next) == len(kept) {
			return nil, nil, err
		}
		kept = next
	}
	return nil, nil, nil
}

// backward runs the backward program for saved inputs and output gradients
// gys, adds the parameters' gradients to c and returns the inputs'.
func (f *Function) backward(ctx context.Context, c *Context, s *signature, need []bool, inputs, gys []*tensor.Dense) ([]*tensor.Dense, error) {
	bp, err := f.backwardProgram(s, need)
	if err != nil {
		return nil, err
	}
	bp.mu.Lock()
	defer bp.mu.Unlock()
	start := time.Now()
	defer func() { f.bwdRuns.Add(1); f.bwdNanos.Add(int64(time.Since(start))) }()
	binds := bindInputs(bp.in, inputs)
	for k, n := range bp.gy {
		g := gys[k]
		if !g.Shape().Eq(s.outMeta[k].shape) {
			g = reshapedCopy(g, s.outMeta[k].shape)
		}
		binds = append(binds, graph.Bind(n, bindable(g, len(n.Shape()) == 0)))
	}
	if len(bp.pgrads) == 0 && !anyNode(bp.ingrads) {
		return make([]*tensor.Dense, len(inputs)), nil
	}
	if err := bp.prog.Run(ctx, binds...); err != nil {
		return nil, err
	}
	for i, p := range bp.params {
		g, err := valueDense(bp.prog.Value(bp.pgrads[i]), p.Value.Shape())
		if err != nil {
			return nil, fmt.Errorf("gradient of %q: %w", p.Name, err)
		}
		if err := c.AccumulateGrad(p, g); err != nil {
			return nil, err
		}
	}
	out := make([]*tensor.Dense, len(inputs))
	for i, n := range bp.ingrads {
		if n == nil {
			continue
		}
		g, err := valueDense(bp.prog.Value(n), s.shapes[i])
		if err != nil {
			return nil, fmt.Errorf("gradient of input %d: %w", i, err)
		}
		out[i] = g
	}
	return out, nil
}

func anyNode(ns []*G.Node) bool {
	for _, n := range ns {
		if n != nil {
			return true
		}
	}
	return false
}
