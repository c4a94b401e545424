package ddp

import (
	"context"
	"fmt"
	"maps"
	"runtime"
	"slices"
	"strings"
	"time"

	G "gorgonia.org/gorgonia"
	"gorgonia.org/tensor"

	"github.com/tandemml/tandem/comm"
	"github.com/tandemml/tandem/graph"
	"github.com/tandemml/tandem/models"
)

// GraphSpec describes a gorgonia graph of the user's own for NewGraph: the
// graph, the scalar loss to minimize, the learnable nodes, and optionally
// their gradient nodes, the nodes fed at every step and the non-learnable
// state to keep identical across ranks.
type GraphSpec struct {
	// Graph holds the forward pass (and the backward pass, when Grads is
	// given).
	Graph *G.ExprGraph
	// Loss is the scalar node whose gradient is averaged: one loss, or the
	// sum of several (G.Add), as the user builds it.
	Loss *G.Node
	// Params are the learnable nodes: variables (G.NewMatrix, G.NewVector,
	// G.NewTensor with a value bound) of dtype float32 or float64, each
	// with a unique name. Their order is the state_dict order: buckets are
	// laid out from the last to the first, as for a models.Module.
	Params G.Nodes
	// Grads are the gradient nodes of Params, in the same order: the result
	// of G.Grad(Loss, Params...). Nil: NewGraph calls G.Grad itself.
	Grads G.Nodes
	// Inputs are the nodes every step must feed (inputs, targets, masks).
	// Nil: every variable of the graph that is neither in Params nor in
	// Buffers. Variables outside all three lists keep whatever value they
	// hold (a frozen weight, another model's weight shared by tensor).
	Inputs G.Nodes
	// Buffers are non-learnable variables whose values rank 0 sends to
	// every rank in NewGraph and, with BroadcastBuffers (the default),
	// before every step.
	Buffers G.Nodes
}

// GraphDDP is DDP over a gorgonia graph the user built: the counterpart of
// DDP for code that does not go through models.Module. See the package
// documentation ("DDP over a gorgonia graph") for how to use it.
//
// A GraphDDP is used from one goroutine at a time; Stats and Buckets may be
// called from any goroutine.
type GraphDDP struct {
	core    *DDP
	g       *G.ExprGraph
	loss    *G.Node
	nodes   G.Nodes // learnable nodes, parallel to core.params
	index   map[*G.Node]int
	grads   G.Nodes // per learnable node: its gradient node (nil when unused)
	inputs  G.Nodes // fed at every step
	feedIdx map[*G.Node]int
	vars    map[*G.Node]string // every variable: its role, for errors
	byName  map[string][]*G.Node
	gradOut []*tensor.Dense // what node.Grad() and Params()[i].Grad are
	fresh   []bool          // holds a reduced gradient not yet applied
	direct  []bool          // gradient node computed into its bucket view in synchronized passes (graphbucket.go)
	gp      *program        // used/unused lists for the reducer
	prog    *graph.Program  // nil under the TapeMachine
	vm      G.VM            // the TapeMachine, if chosen
	open    *Pass
}

// WithTapeMachine makes NewGraph run the graph with gorgonia's TapeMachine
// instead of Tandem's graph executor. TapeMachine has no hooks, so every
// bucket is reduced after the backward pass has ended: nothing overlaps
// (Stats.BucketsOverlapped stays 0). The reduced gradients are the same.
// Only NewGraph reads this option.
func WithTapeMachine() Option {
	return func(c *config) error { c.tape = true; return nil }
}

// NewGraph wraps a user's gorgonia graph for data-parallel training over pg
// (nil: comm.Default()). Every rank calls it with the same graph (same
// nodes, ops, shapes and dtypes, built in the same order) and the same
// options; NewGraph checks that (an error wrapping ErrMismatch names the
// first parameter or node that differs and the ranks), copies rank 0's
// values of Params and Buffers into every rank's, builds the backward pass
// when spec.Grads is nil, compiles the graph for the executor (Tandem's
// graph executor, or TapeMachine with WithTapeMachine) and lays out the
// gradient buckets as New does.
//
// It binds a dual value to every learnable node, so that node.Grad()
// returns the averaged gradient after each step (what gorgonia's solvers
// read), the same tensor as Params()[i].Grad (what Tandem's optimizers
// read). Options that only concern models.Module (WithLoss,
// WithBuilderOptions, MaxPrograms) are ignored.
func NewGraph(ctx context.Context, pg *comm.ProcessGroup, spec GraphSpec, opts ...Option) (*GraphDDP, error) {
	if ctx == nil {
		return nil, fmt.Errorf("ddp: NewGraph: nil context: %w", ErrInvalidArgument)
	}
	if pg == nil {
		pg = comm.Default()
		if pg == nil {
			return nil, fmt.Errorf("ddp: NewGraph: no process group given and no default group; call comm.InitFromEnv first: %w", ErrInvalidArgument)
		}
	}
	cfg := defaultConfig()
	for _, o := range opts {
		if o == nil {
			continue
		}
		if err := o(&cfg); err != nil {
			return nil, err
		}
	}
	d := &DDP{pg: pg, cfg: cfg, world: pg.Size(), rank: pg.Rank(), index: map[*models.Param]int{}}
	n := &GraphDDP{core: d}
	sig := replicaSig{Options: cfg.optionsSig()}
	localErr := n.collect(spec, &sig)
	if localErr == nil {
		localErr = n.compile()
	}
	if localErr == nil {
		n.findDirect()
	}
	if err := d.setup(ctx, sig, localErr); err != nil {
		return nil, err
	}
	for pi, nd := range n.nodes {
		if err := bindGrad(nd, n.gradOut[pi]); err != nil {
			return nil, err
		}
	}
	return n, nil
}

// bindGrad makes node.Grad() return t, binding a dual value to the node.
func bindGrad(nd *G.Node, t *tensor.Dense) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("ddp: binding the gradient of node %q: %v: %w", nd.Name(), r, ErrInvalidArgument)
		}
	}()
	G.WithGrad(t)(nd)
	return nil
}

// collect checks the spec, lists the learnable nodes and buffers as
// models.Params, builds the backward pass if needed and describes the graph
// for the comparison across ranks.
func (n *GraphDDP) collect(spec GraphSpec, sig *replicaSig) error {
	d := n.core
	g := spec.Graph
	if g == nil {
		return fmt.Errorf("ddp: NewGraph: the spec has no Graph: %w", ErrInvalidArgument)
	}
	n.g = g
	inGraph := func(what string, nd *G.Node) error {
		if nd == nil {
			return fmt.Errorf("ddp: NewGraph: %s is nil: %w", what, ErrInvalidArgument)
		}
		if nd.Graph() != g {
			return fmt.Errorf("ddp: NewGraph: %s %q is not a node of the spec's Graph: %w", what, nd.Name(), ErrInvalidArgument)
		}
		return nil
	}
	if err := inGraph("the Loss", spec.Loss); err != nil {
		return err
	}
	if !spec.Loss.IsScalar() {
		return fmt.Errorf("ddp: NewGraph: the loss%s has shape %v; it must be a scalar (take G.Mean or G.Sum of it): %w", nodeLabel(spec.Loss), spec.Loss.Shape(), ErrInvalidArgument)
	}
	if dt := spec.Loss.Dtype(); dt != tensor.Float64 && dt != tensor.Float32 {
		return fmt.Errorf("ddp: NewGraph: the loss%s has dtype %v; want float32 or float64: %w", nodeLabel(spec.Loss), dt, ErrInvalidArgument)
	}
	n.loss = spec.Loss
	if len(spec.Params) == 0 {
		return fmt.Errorf("ddp: NewGraph: the spec lists no learnable node in Params: %w", ErrInvalidArgument)
	}
	if spec.Grads != nil && len(spec.Grads) != len(spec.Params) {
		return fmt.Errorf("ddp: NewGraph: %d gradient nodes for %d learnable nodes; pass G.Grad(loss, params...)'s result in the same order, or none: %w", len(spec.Grads), len(spec.Params), ErrInvalidArgument)
	}
	n.index = map[*G.Node]int{}
	n.vars = map[*G.Node]string{}
	names := map[string]bool{}
	state := func(kind string, nd *G.Node) (*models.Param, error) {
		if err := inGraph("a node of "+kind, nd); err != nil {
			return nil, err
		}
		if !nd.IsVar() {
			return nil, fmt.Errorf("ddp: NewGraph: %s node %q is computed by the graph (op %v); list variables only: %w", kind, nd.Name(), nd.Op(), ErrInvalidArgument)
		}
		if n.vars[nd] != "" {
			return nil, fmt.Errorf("ddp: NewGraph: node %q is listed twice (as %s and %s): %w", nd.Name(), n.vars[nd], kind, ErrInvalidArgument)
		}
		name := nd.Name()
		if name == "" || names[name] {
			return nil, fmt.Errorf("ddp: NewGraph: two state nodes are named %q; give each learnable node and buffer a unique name (G.WithName): %w", name, ErrInvalidArgument)
		}
		v, ok := nd.Value().(*tensor.Dense)
		if !ok {
			return nil, fmt.Errorf("ddp: NewGraph: %s node %q holds %T; DDP needs a tensor value (bind one with G.WithValue or G.WithInit; a scalar parameter must be a tensor of shape (1)): %w", kind, name, nd.Value(), ErrInvalidArgument)
		}
		if v.RequiresIterator() {
			return nil, fmt.Errorf("ddp: NewGraph: %s node %q is not contiguous in memory: %w", kind, name, ErrInvalidArgument)
		}
		if !broadcastable(v.Dtype()) {
			return nil, fmt.Errorf("ddp: NewGraph: %s node %q has dtype %v, which collectives cannot carry: %w", kind, name, v.Dtype(), ErrInvalidArgument)
		}
		names[name] = true
		n.vars[nd] = kind
		return &models.Param{Name: name, Value: v}, nil
	}
	for _, nd := range spec.Params {
		p, err := state("learnable", nd)
		if err != nil {
			return err
		}
		if dt := p.Value.Dtype(); dt != tensor.Float64 && dt != tensor.Float32 {
			return fmt.Errorf("ddp: NewGraph: learnable node %q has dtype %v; want float32 or float64: %w", p.Name, dt, ErrInvalidArgument)
		}
		p.RequiresGrad = true
		n.index[nd] = len(n.nodes)
		n.nodes = append(n.nodes, nd)
		d.index[p] = len(d.params)
		d.params = append(d.params, p)
		sig.Entries = append(sig.Entries, sigOf("parameter", p))
	}
	d.allParams = d.params
	for _, nd := range spec.Buffers {
		p, err := state("buffer", nd)
		if err != nil {
			return err
		}
		d.buffers = append(d.buffers, p)
		sig.Entries = append(sig.Entries, sigOf("buffer", p))
	}

	// Which learnable nodes does the loss depend on?
	reach := reachable(g, spec.Loss)
	used := make([]bool, len(n.nodes))
	var unreached []string
	for pi, nd := range n.nodes {
		used[pi] = reach[nd]
		if !used[pi] {
			unreached = append(unreached, fmt.Sprintf("%q", nd.Name()))
		}
	}
	if len(unreached) > 0 && !d.cfg.findUnused && !d.cfg.staticGraph {
		return fmt.Errorf("ddp: NewGraph: no gradient reaches learnable node %s: the loss%s does not depend on it; remove it from Params, or pass ddp.FindUnusedParameters(true) to train with parameters a step does not use: %w",
			strings.Join(unreached, ", "), nodeLabel(spec.Loss), ErrInvalidArgument)
	}
	n.grads = make(G.Nodes, len(n.nodes))
	if spec.Grads != nil {
		for pi, gn := range spec.Grads {
			nd := n.nodes[pi]
			if !used[pi] {
				continue
			}
			if err := inGraph(fmt.Sprintf("the gradient of %q", nd.Name()), gn); err != nil {
				return err
			}
			if !gn.Shape().Eq(nd.Shape()) || gn.Dtype() != nd.Dtype() {
				return fmt.Errorf("ddp: NewGraph: the gradient node given for %q is %v %v, the node %v %v: Grads must be G.Grad's result in the order of Params: %w",
					nd.Name(), gn.Dtype(), gn.Shape(), nd.Dtype(), nd.Shape(), ErrInvalidArgument)
			}
			n.grads[pi] = gn
		}
	} else {
		var wrt G.Nodes
		for pi, nd := range n.nodes {
			if used[pi] {
				wrt = append(wrt, nd)
			}
		}
		buildMu.Lock()
		gs, err := G.Grad(spec.Loss, wrt...)
		buildMu.Unlock()
		if err != nil {
			return fmt.Errorf("ddp: NewGraph: building the backward pass of the loss%s: %v: %w", nodeLabel(spec.Loss), err, ErrInvalidArgument)
		}
		k := 0
		for pi := range n.nodes {
			if used[pi] {
				n.grads[pi] = gs[k]
				k++
			}
		}
	}
	gp := &program{used: used}
	for pi, u := range used {
		if u {
			gp.hooked = append(gp.hooked, pi)
		} else {
			gp.unused = append(gp.unused, pi)
		}
	}
	gp.grads = len(gp.hooked)
	n.gp = gp

	// The nodes fed at every step.
	if spec.Inputs != nil {
		for _, nd := range spec.Inputs {
			if err := inGraph("an input node", nd); err != nil {
				return err
			}
			if !nd.IsVar() {
				return fmt.Errorf("ddp: NewGraph: input node %q is computed by the graph (op %v); inputs are variables: %w", nd.Name(), nd.Op(), ErrInvalidArgument)
			}
			if k := n.vars[nd]; k != "" {
				return fmt.Errorf("ddp: NewGraph: node %q is listed both as %s and as an input: %w", nd.Name(), k, ErrInvalidArgument)
			}
			n.vars[nd] = "input"
			n.inputs = append(n.inputs, nd)
		}
	}
	for _, nd := range g.Inputs() {
		if !nd.IsVar() || n.vars[nd] != "" {
			continue
		}
		if spec.Inputs == nil {
			n.vars[nd] = "input"
			n.inputs = append(n.inputs, nd)
		} else {
			n.vars[nd] = "variable kept as it is (not in Inputs)"
		}
	}
	n.feedIdx = map[*G.Node]int{}
	n.byName = map[string][]*G.Node{}
	for i, nd := range n.inputs {
		n.feedIdx[nd] = i
	}
	for nd := range n.vars {
		n.byName[nd.Name()] = append(n.byName[nd.Name()], nd)
	}

	n.gradOut = make([]*tensor.Dense, len(n.nodes))
	for pi, p := range d.params {
		n.gradOut[pi] = tensor.New(tensor.Of(p.Value.Dtype()), tensor.WithShape(p.Value.Shape().Clone()...))
	}
	n.fresh = make([]bool, len(n.nodes))
	desc, err := describeGraph(g)
	if err != nil {
		return err
	}
	sig.Graph = desc
	return nil
}

// compile builds the executor: Tandem's graph executor with a gradient
// hook per used learnable node, or gorgonia's TapeMachine.
func (n *GraphDDP) compile() error {
	d := n.core
	if d.cfg.tape {
		buildMu.Lock()
		defer buildMu.Unlock()
		var vm G.VM
		err := func() (err error) {
			defer func() {
				if r := recover(); r != nil {
					err = fmt.Errorf("%v", r)
				}
			}()
			vm = G.NewTapeMachine(n.g)
			return nil
		}()
		if err != nil {
			return fmt.Errorf("ddp: NewGraph: compiling the graph for gorgonia's TapeMachine: %v: %w", err, ErrInvalidArgument)
		}
		n.vm = vm
		return nil
	}
	var wrt, grads G.Nodes
	for _, pi := range n.gp.hooked {
		wrt = append(wrt, n.nodes[pi])
		grads = append(grads, n.grads[pi])
	}
	copts := []graph.Option{graph.WithGrads(wrt, grads)}
	if d.cfg.workers > 0 {
		copts = append(copts, graph.Workers(d.cfg.workers))
	}
	prog, err := graph.Compile(n.g, copts...)
	if err != nil {
		return fmt.Errorf("ddp: NewGraph: compiling the graph: %w", err)
	}
	for _, pi := range n.gp.hooked {
		if err := prog.OnGradReady(n.nodes[pi], func(_ context.Context, _ *G.Node, v G.Value) error {
			return n.hookReady(pi, v)
		}); err != nil {
			return err
		}
	}
	// As in DDP.compile: the loss ends the forward pass.
	if err := prog.OnNodeReady(n.loss, func(context.Context, *G.Node, G.Value) error {
		if p := n.open; p != nil {
			p.s.forwardEnd = time.Now()
		}
		return nil
	}); err != nil {
		return fmt.Errorf("ddp: NewGraph: %w", err)
	}
	if d.world > 1 && runtime.GOMAXPROCS(0) == 1 {
		// See DDP.compile: offer the processor to the goroutines moving
		// buckets between nodes while reductions are in flight.
		prog.OnReady(func(context.Context, *G.Node, G.Value) error {
			if d.commActive.Load() {
				runtime.Gosched()
			}
			return nil
		})
	}
	n.prog = prog
	return nil
}

// nodeLabel returns " \"name\"" for a node the user named, and nothing
// for one that carries gorgonia's generated name (its op and its
// children's ids), which would only confuse an error message.
func nodeLabel(nd *G.Node) string {
	name := nd.Name()
	if name == "" || !nd.IsVar() && strings.Contains(name, "(%") {
		return ""
	}
	return fmt.Sprintf(" %q", name)
}

// reachable returns the nodes that root depends on, root included.
func reachable(g *G.ExprGraph, root *G.Node) map[*G.Node]bool {
	seen := map[*G.Node]bool{root: true}
	stack := []*G.Node{root}
	for len(stack) > 0 {
		nd := stack[len(stack)-1]
		stack = stack[:len(stack)-1]
		it := g.From(nd.ID())
		for it.Next() {
			c := it.Node().(*G.Node)
			if !seen[c] {
				seen[c] = true
				stack = append(stack, c)
			}
		}
	}
	return seen
}

// describeGraph lists the graph's nodes in execution order, each with its
// op (or its name, for a variable), dtype and shape: what every rank must
// agree on.
func describeGraph(g *G.ExprGraph) ([]string, error) {
	sorted, err := G.Sort(g)
	if err != nil {
		return nil, fmt.Errorf("ddp: NewGraph: cannot order the graph (is there a cycle?): %v: %w", err, ErrInvalidArgument)
	}
	out := make([]string, 0, len(sorted))
	for i := len(sorted) - 1; i >= 0; i-- {
		nd := sorted[i]
		var what string
		switch {
		case nd.IsVar():
			what = fmt.Sprintf("variable %q", nd.Name())
		case nd.Op() != nil:
			what = fmt.Sprintf("%v", nd.Op())
		default:
			what = nd.Name()
		}
		out = append(out, fmt.Sprintf("%s %v %v", what, nd.Dtype(), nd.Shape()))
	}
	return out, nil
}

// Feeds gives a step's input nodes their values: ByName or ByNode.
type Feeds interface {
	resolve(n *GraphDDP) (map[*G.Node]*tensor.Dense, error)
}

// ByName feeds input nodes by their names (G.WithName).
type ByName map[string]*tensor.Dense

// ByNode feeds input nodes by node.
type ByNode map[*G.Node]*tensor.Dense

func (f ByName) resolve(n *GraphDDP) (map[*G.Node]*tensor.Dense, error) {
	out := make(map[*G.Node]*tensor.Dense, len(f))
	for _, name := range slices.Sorted(maps.Keys(f)) {
		nds := n.byName[name]
		switch len(nds) {
		case 0:
			return nil, fmt.Errorf("ddp: feed %q: the graph has no variable of that name; inputs are %s: %w", name, n.inputNames(), ErrInvalidArgument)
		case 1:
		default:
			return nil, fmt.Errorf("ddp: feed %q: %d variables of the graph have that name; feed them with ddp.ByNode: %w", name, len(nds), ErrInvalidArgument)
		}
		out[nds[0]] = f[name]
	}
	return out, nil
}

func (f ByNode) resolve(*GraphDDP) (map[*G.Node]*tensor.Dense, error) { return f, nil }

func (n *GraphDDP) inputNames() string {
	if len(n.inputs) == 0 {
		return "none"
	}
	s := make([]string, len(n.inputs))
	for i, nd := range n.inputs {
		s[i] = fmt.Sprintf("%q %v %v", nd.Name(), nd.Dtype(), nd.Shape())
	}
	return strings.Join(s, ", ")
}

// feedValues checks a step's feeds: every input fed, nothing else, with the
// node's dtype and shape.
func (n *GraphDDP) feedValues(f Feeds) ([]*tensor.Dense, error) {
	if f == nil {
		if len(n.inputs) == 0 {
			return nil, nil
		}
		return nil, fmt.Errorf("ddp: no feeds; the graph's inputs are %s: %w", n.inputNames(), ErrInvalidArgument)
	}
	m, err := f.resolve(n)
	if err != nil {
		return nil, err
	}
	vals := make([]*tensor.Dense, len(n.inputs))
	for nd, v := range m {
		i, ok := n.feedIdx[nd]
		if !ok {
			if nd == nil {
				return nil, fmt.Errorf("ddp: feed for a nil node: %w", ErrInvalidArgument)
			}
			role := n.vars[nd]
			if role == "" {
				role = "not an input of the graph"
				if nd.Graph() == n.g && !nd.IsVar() {
					role = fmt.Sprintf("computed by the graph (op %v)", nd.Op())
				}
			}
			return nil, fmt.Errorf("ddp: feed for node %q, which is %s; inputs are %s: %w", nd.Name(), role, n.inputNames(), ErrInvalidArgument)
		}
		if v == nil {
			return nil, fmt.Errorf("ddp: feed for node %q is nil: %w", nd.Name(), ErrInvalidArgument)
		}
		if v.Dtype() != nd.Dtype() || !v.Shape().Eq(nd.Shape()) {
			return nil, fmt.Errorf("ddp: feed for node %q is %v %v; the node is %v %v (gorgonia graphs have fixed shapes: a short last batch needs a graph of its own, or drop it): %w",
				nd.Name(), v.Dtype(), v.Shape(), nd.Dtype(), nd.Shape(), ErrInvalidArgument)
		}
		vals[i] = v
	}
	var missing []string
	for i, v := range vals {
		if v == nil {
			nd := n.inputs[i]
			missing = append(missing, fmt.Sprintf("%q (%v %v)", nd.Name(), nd.Dtype(), nd.Shape()))
		}
	}
	if len(missing) > 0 {
		return nil, fmt.Errorf("ddp: no feed for input node %s: every step feeds all of the graph's inputs (GraphSpec.Inputs lists them, or leaves out the ones that keep their values): %w", strings.Join(missing, ", "), ErrInvalidArgument)
	}
	return vals, nil
}

// Step runs one training step: it feeds the inputs, runs forward and
// backward, and reduces the gradients (during the backward pass under the
// graph executor, after it under TapeMachine). It returns this rank's value
// of the loss once every bucket is reduced, leaving the averaged gradient
// in node.Grad() and Params()[i].Grad; the values of other nodes (outputs,
// other losses) are bound to them (node.Value()) until the next step. Apply
// a solver, or step an optimizer, next.
//
// Step is Prepare, Pass.Run and Pass.Finish in one call. Inside NoSync it
// only accumulates this rank's gradients. As with DDP.Step, every rank calls
// it the same number of times, and a failed step aborts the process group.
func (n *GraphDDP) Step(ctx context.Context, feeds Feeds) (float64, error) {
	p, err := n.Prepare(ctx)
	if err != nil {
		return 0, err
	}
	loss, err := p.Run(ctx, feeds)
	if err != nil {
		return 0, err
	}
	if err := p.Finish(ctx); err != nil {
		return 0, err
	}
	return loss, nil
}

// NoSync runs fn with gradient synchronization off (PyTorch's no_sync):
// steps and passes inside fn add this rank's gradients into a local
// accumulator without communicating; the first synchronized step after it
// adds its own and reduces the sum. See DDP.NoSync.
func (n *GraphDDP) NoSync(fn func() error) error { return n.core.NoSync(fn) }

// Join runs fn, this rank's training loop, tolerating uneven inputs: ranks
// may run different numbers of steps (or passes) inside fn. A rank whose fn
// has returned shadows the others' steps with zero gradients until every
// rank is done; then every rank takes the weights (and buffers) of the last
// rank to finish. See DDP.Join for the details.
func (n *GraphDDP) Join(ctx context.Context, fn func() error) error { return n.core.Join(ctx, fn) }

// Params returns the learnable nodes as models.Params, in the order of
// GraphSpec.Params: what Tandem's optimizers take. Value is the node's
// value tensor (updated in place), Grad the node's averaged gradient after
// a step (the tensor node.Grad() returns).
func (n *GraphDDP) Params() []*models.Param { return slices.Clone(n.core.params) }

// ParamsOf returns the models.Params of the given learnable nodes, for an
// optimizer over part of the model (one of two alternating models, a
// parameter group). A node that is not one of the DDP's learnable nodes is
// an error naming it.
func (n *GraphDDP) ParamsOf(nodes ...*G.Node) ([]*models.Param, error) {
	out := make([]*models.Param, len(nodes))
	for i, nd := range nodes {
		pi, err := n.learnable("ParamsOf", nd)
		if err != nil {
			return nil, err
		}
		out[i] = n.core.params[pi]
	}
	return out, nil
}

// Nodes returns the learnable nodes, in the order of GraphSpec.Params.
func (n *GraphDDP) Nodes() G.Nodes { return slices.Clone(n.nodes) }

// GradNode returns the gradient node of a learnable node (the one given in
// GraphSpec.Grads or built by NewGraph), nil for a node the loss does not
// use or that is not learnable.
//
// Under Tandem's graph executor a gradient node that no other node of the
// graph reads is computed straight into its bucket view in a synchronized
// pass, so after Finish its value is the averaged gradient, and during the
// pass it is being reduced: a hook of one's own on it (Program's
// OnNodeReady) must not read it. A gradient node that the graph reads (a
// gradient norm built into the graph) keeps this rank's own gradient and is
// copied into its bucket.
func (n *GraphDDP) GradNode(nd *G.Node) *G.Node {
	pi, ok := n.index[nd]
	if !ok {
		return nil
	}
	return n.grads[pi]
}

// ValueGrads returns the learnable nodes as gorgonia ValueGrads, for a
// gorgonia Solver's Step (Apply does the same with checks).
func (n *GraphDDP) ValueGrads() []G.ValueGrad { return G.NodesToValueGrads(n.nodes) }

// Apply runs a gorgonia Solver (G.NewVanillaSolver, G.NewAdamSolver, ...)
// on the averaged gradients of the given learnable nodes (all of them when
// none is given; with FindUnusedParameters, those that have a gradient).
// It refuses, naming the node, a node that is not one of the DDP's
// learnable nodes, and a node whose gradient is not a reduced one: no
// synchronized step since the last Apply (a step inside NoSync only holds
// this rank's gradient, and applying it would make the replicas diverge).
// Calling s.Step(net.ValueGrads()) directly works too, without the checks.
func (n *GraphDDP) Apply(s G.Solver, nodes ...*G.Node) error {
	if s == nil {
		return fmt.Errorf("ddp: Apply: nil solver: %w", ErrInvalidArgument)
	}
	d := n.core
	d.mu.Lock()
	defer d.mu.Unlock()
	if n.open != nil {
		return fmt.Errorf("ddp: Apply: a pass is open; call its Finish first: %w", ErrInvalidArgument)
	}
	var sel []int
	if len(nodes) == 0 {
		for pi := range n.nodes {
			if d.hasGrad[pi] {
				sel = append(sel, pi)
			}
		}
		if len(sel) == 0 {
			sel = []int{0} // refused below: nothing was reduced yet
		}
	} else {
		for _, nd := range nodes {
			pi, err := n.learnable("Apply", nd)
			if err != nil {
				return err
			}
			sel = append(sel, pi)
		}
	}
	vgs := make([]G.ValueGrad, len(sel))
	for i, pi := range sel {
		if !n.fresh[pi] {
			return fmt.Errorf("ddp: Apply: learnable node %q has no reduced gradient to apply: no synchronized step has finished since its last update (steps inside NoSync only accumulate this rank's gradient): %w", n.nodes[pi].Name(), ErrInvalidArgument)
		}
		if err := n.checkValue(pi); err != nil {
			return err
		}
		vgs[i] = n.nodes[pi]
	}
	if err := s.Step(vgs); err != nil {
		return fmt.Errorf("ddp: Apply: the solver's step: %w", err)
	}
	for _, pi := range sel {
		n.fresh[pi] = false
	}
	return nil
}

// learnable returns the index of a learnable node, or an error naming it.
func (n *GraphDDP) learnable(op string, nd *G.Node) (int, error) {
	if nd == nil {
		return 0, fmt.Errorf("ddp: %s: nil node: %w", op, ErrInvalidArgument)
	}
	pi, ok := n.index[nd]
	if ok {
		return pi, nil
	}
	what := "a node of another graph"
	if nd.Graph() == n.g {
		what = "not one of its learnable nodes"
		if role := n.vars[nd]; role != "" {
			what = "listed as " + role + ", not as learnable"
		}
	}
	names := make([]string, len(n.nodes))
	for i, x := range n.nodes {
		names[i] = fmt.Sprintf("%q", x.Name())
	}
	return 0, fmt.Errorf("ddp: %s: node %q is unknown to this DDP (%s); its learnable nodes are %s: %w", op, nd.Name(), what, strings.Join(names, ", "), ErrInvalidArgument)
}

// checkValue fails when a learnable node's value is no longer the tensor
// DDP shares with Params (gorgonia.Let bound a new one).
func (n *GraphDDP) checkValue(pi int) error {
	nd := n.nodes[pi]
	v, ok := nd.Value().(*tensor.Dense)
	if !ok || v != n.core.params[pi].Value {
		return fmt.Errorf("ddp: the value of learnable node %q was replaced after NewGraph (gorgonia.Let?); change it in place, as solvers and optimizers do, so that every rank's replica and the DDP see it: %w", nd.Name(), ErrInvalidArgument)
	}
	return nil
}

// Graph returns the graph.
func (n *GraphDDP) Graph() *G.ExprGraph { return n.g }

// Program returns the compiled program of Tandem's graph executor (nil
// under WithTapeMachine), for hooks of one's own (Program.OnNodeReady).
func (n *GraphDDP) Program() *graph.Program { return n.prog }

// Group returns the process group the DDP reduces over.
func (n *GraphDDP) Group() *comm.ProcessGroup { return n.core.pg }

// Buckets returns the current bucket layout (see DDP.Buckets).
func (n *GraphDDP) Buckets() []BucketInfo { return n.core.Buckets() }

// Stats returns the counters so far (see DDP.Stats).
func (n *GraphDDP) Stats() Stats { return n.core.Stats() }

// ResetStats zeroes the counters.
func (n *GraphDDP) ResetStats() { n.core.ResetStats() }
