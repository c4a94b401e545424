package graph

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"

	G "gorgonia.org/gorgonia"
)

// nodeKind says how the executor treats a node.
type nodeKind uint8

const (
	kindInput nodeKind = iota // a variable or random node: its value is bound, not computed
	kindOp                    // an op applied to its children
	kindLet                   // gorgonia.Set: a statement TapeMachine does not execute
	kindRead                  // gorgonia.Read: copies its child's value out
)

// Program is a gorgonia graph compiled for repeated execution: the nodes in
// topological order, how many inputs each one waits for, who consumes each
// value, the hooks, and the buffers kept from one run to the next.
//
// A Program's Run calls are serialized; hooks may be registered at any time
// (a hook registered during a run takes effect from the next node that
// completes). Values read with Value, Grad or gorgonia's Node.Value after a
// run stay valid until the next Run starts (see ReuseBuffers).
type Program struct {
	g   *G.ExprGraph
	cfg config

	nodes     []*G.Node
	index     map[*G.Node]int32
	kind      []nodeKind
	children  [][]int32 // in the op's argument order, duplicates kept
	consumers [][]int32 // distinct non-input nodes reading each node
	deps      []int32   // distinct non-input children of each node
	inputs    []int32   // input nodes, in topological order
	steps     []int32   // non-input nodes, in topological order, the RunLast nodes at the end
	par       []int32   // steps without the RunLast nodes: what runs in parallel
	last      []int32   // the RunLast nodes, in their order
	starts    []int32   // nodes of par with no non-input child
	shared    []bool    // value read by more than one node
	prealloc  []bool    // op can write into a kept buffer
	accum     []bool    // op adds into a preallocated buffer (see accumulatesIntoPrealloc)
	ctxDoer   []ContextDoer
	readInto  []*G.Value
	dualOf    [][]*G.Node // for a gradient node: nodes whose dual value receives it
	gradOf    map[*G.Node]*G.Node

	hookMu    sync.Mutex
	allHooks  atomic.Pointer[[]ReadyFunc]
	nodeHooks []atomic.Pointer[[]ReadyFunc]

	runMu    sync.Mutex
	hookCtx  context.Context // the context given to the current Run
	vals     []G.Value
	args     [][]G.Value
	pending  []atomic.Int32
	bufs     []G.Value // buffers each node may write into in the next run
	next     []G.Value // buffers found reusable during the current run
	owned    []bool    // value of the current run is memory no input shares
	out      []G.Value // memory each node's value must be written into (SetOutput), or nil
	outNodes []int32   // the nodes with an output
	outSet   bool      // SetOutput changed out since the last run
	changed  atomic.Bool
	spans    []span // validated buffers, sorted by address
	scratch  []span
	queue    chan int32
}

// Compile turns g, including the gradient nodes gorgonia.Grad added to it,
// into a Program. It sorts the nodes as TapeMachine does, counts each node's
// dependencies and consumers, and works out which ops can reuse their output
// buffers. Compile puts ops that implement gorgonia.TrainModeOp in training
// mode unless EvalMode is given. Nodes added to g afterwards are not part of
// the program: compile again to include them.
func Compile(g *G.ExprGraph, opts ...Option) (*Program, error) {
	if g == nil {
		return nil, fmt.Errorf("graph: Compile: nil graph: %w", ErrInvalidArgument)
	}
	cfg := defaultConfig()
	for _, o := range opts {
		if err := o(&cfg); err != nil {
			return nil, err
		}
	}
	if len(g.AllNodes()) == 0 {
		return nil, fmt.Errorf("graph: Compile: the graph has no nodes: %w", ErrInvalidArgument)
	}
	sorted, err := G.Sort(g)
	if err != nil {
		return nil, fmt.Errorf("graph: Compile: cannot order the graph (is there a cycle?): %v: %w", err, ErrInvalidArgument)
	}
	// gorgonia.Sort lists consumers before what they consume; run order is the reverse.
	n := len(sorted)
	nodes := make([]*G.Node, n)
	for i, nd := range sorted {
		nodes[n-1-i] = nd
	}
	p := &Program{
		g:         g,
		cfg:       cfg,
		nodes:     nodes,
		index:     make(map[*G.Node]int32, n),
		kind:      make([]nodeKind, n),
		children:  make([][]int32, n),
		consumers: make([][]int32, n),
		deps:      make([]int32, n),
		shared:    make([]bool, n),
		prealloc:  make([]bool, n),
		accum:     make([]bool, n),
		ctxDoer:   make([]ContextDoer, n),
		readInto:  make([]*G.Value, n),
		dualOf:    make([][]*G.Node, n),
		gradOf:    make(map[*G.Node]*G.Node),
		nodeHooks: make([]atomic.Pointer[[]ReadyFunc], n),
		vals:      make([]G.Value, n),
		args:      make([][]G.Value, n),
		pending:   make([]atomic.Int32, n),
		bufs:      make([]G.Value, n),
		next:      make([]G.Value, n),
		owned:     make([]bool, n),
		out:       make([]G.Value, n),
	}
	for i, nd := range nodes {
		p.index[nd] = int32(i)
	}
	isInput := make(map[*G.Node]bool)
	for _, in := range g.Inputs() {
		isInput[in] = true
	}

	for i, nd := range nodes {
		op := nd.Op()
		switch {
		case isInput[nd]:
			p.kind[i] = kindInput
		case op == nil:
			return nil, fmt.Errorf("graph: Compile: node %q has no op and is not an input: %w", nd.Name(), ErrInvalidArgument)
		case isLetOp(op):
			p.kind[i] = kindLet
		case isReadOp(op):
			into := readTarget(op)
			if into == nil {
				return nil, fmt.Errorf("graph: Compile: node %q: cannot find where gorgonia.Read writes: %w", nd.Name(), ErrInvalidArgument)
			}
			p.kind[i] = kindRead
			p.readInto[i] = into
		default:
			p.kind[i] = kindOp
			if cd, ok := op.(ContextDoer); ok {
				p.ctxDoer[i] = cd
			}
			_, pd := op.(G.UsePreallocDoer)
			p.accum[i] = accumulatesIntoPrealloc(op)
			p.prealloc[i] = cfg.reuse && (pd || p.ctxDoer[i] != nil) && !p.accum[i]
			if tm, ok := op.(G.TrainModeOp); ok {
				if err := tm.SetTraining(!cfg.evalMode); err != nil {
					return nil, fmt.Errorf("graph: Compile: node %q (%v): setting training mode: %w", nd.Name(), op, err)
				}
			}
		}
		if p.kind[i] == kindInput {
			continue
		}
		it := g.From(nd.ID())
		var kids []int32
		for it.Next() {
			c := it.Node().(*G.Node)
			ci, ok := p.index[c]
			if !ok {
				return nil, fmt.Errorf("graph: Compile: node %q reads %q, which is not in the graph: %w", nd.Name(), c.Name(), ErrInvalidArgument)
			}
			if ci >= int32(i) {
				return nil, fmt.Errorf("graph: Compile: node %q is ordered before its input %q: %w", nd.Name(), c.Name(), ErrInvalidArgument)
			}
			kids = append(kids, ci)
		}
		p.children[i] = kids
		p.args[i] = make([]G.Value, len(kids))
		for j, ci := range kids {
			if containsBefore(kids, j, ci) {
				continue // the same child twice counts once
			}
			p.consumers[ci] = append(p.consumers[ci], int32(i))
			if p.kind[ci] != kindInput {
				p.deps[i]++
			}
		}
	}
	for i := range nodes {
		p.shared[i] = len(p.consumers[i]) > 1
		if p.kind[i] == kindInput {
			p.inputs = append(p.inputs, int32(i))
			continue
		}
		p.steps = append(p.steps, int32(i))
		if p.deps[i] == 0 {
			p.starts = append(p.starts, int32(i))
		}
	}
	if err := p.orderLast(); err != nil {
		return nil, err
	}
	if err := p.setupGrads(); err != nil {
		return nil, err
	}
	p.queue = make(chan int32, len(p.steps)+1)
	return p, nil
}

// orderLast moves the RunLast nodes to the end of the steps, out of the
// parallel phase: no node waits for them, and they start once it is over.
func (p *Program) orderLast() error {
	p.par = p.steps
	if len(p.cfg.last) == 0 {
		return nil
	}
	isLast := make(map[int32]bool, len(p.cfg.last))
	for _, n := range p.cfg.last {
		i, ok := p.index[n]
		switch {
		case !ok:
			return fmt.Errorf("graph: Compile: RunLast: node %v is not in the graph: %w", n, ErrInvalidArgument)
		case p.kind[i] != kindOp:
			return fmt.Errorf("graph: Compile: RunLast: node %q is not computed by an op: %w", n.Name(), ErrInvalidArgument)
		case len(p.consumers[i]) > 0:
			return fmt.Errorf("graph: Compile: RunLast: node %q is read by node %q; only nodes nothing reads can run last: %w",
				n.Name(), p.nodes[p.consumers[i][0]].Name(), ErrInvalidArgument)
		case isLast[i]:
			return fmt.Errorf("graph: Compile: RunLast: node %q given twice: %w", n.Name(), ErrInvalidArgument)
		}
		isLast[i] = true
		p.last = append(p.last, i)
	}
	p.par = make([]int32, 0, len(p.steps)-len(p.last))
	for _, i := range p.steps {
		if !isLast[i] {
			p.par = append(p.par, i)
		}
	}
	p.steps = append(slices.Clone(p.par), p.last...)
	p.starts = slices.DeleteFunc(p.starts, func(i int32) bool { return isLast[i] })
	for i, cs := range p.consumers {
		p.consumers[i] = slices.DeleteFunc(cs, func(c int32) bool { return isLast[c] })
	}
	return nil
}

// setupGrads builds the map from differentiated nodes to gradient nodes and
// the list of dual values each gradient node feeds.
func (p *Program) setupGrads() error {
	c := &p.cfg
	for i, w := range c.gradWRT {
		if _, ok := p.index[w]; !ok {
			return fmt.Errorf("graph: WithGrads: node %q is not in the graph: %w", w.Name(), ErrInvalidArgument)
		}
		if _, ok := p.index[c.gradNodes[i]]; !ok {
			return fmt.Errorf("graph: WithGrads: gradient node %q of %q is not in the graph: %w", c.gradNodes[i].Name(), w.Name(), ErrInvalidArgument)
		}
		p.gradOf[w] = c.gradNodes[i]
	}
	var targets []*G.Node
	switch {
	case c.dualAll:
		for _, in := range p.inputs {
			if p.GradNode(p.nodes[in]) != nil {
				targets = append(targets, p.nodes[in])
			}
		}
	default:
		targets = c.dual
	}
	for _, t := range targets {
		if _, ok := p.index[t]; !ok {
			return fmt.Errorf("graph: BindDualValues: node %q is not in the graph: %w", t.Name(), ErrInvalidArgument)
		}
		gn := p.GradNode(t)
		if gn == nil {
			return fmt.Errorf("graph: BindDualValues: node %q has no gradient node; call gorgonia.Grad first: %w", t.Name(), ErrInvalidArgument)
		}
		gi := p.index[gn]
		if !containsNode(p.dualOf[gi], t) {
			p.dualOf[gi] = append(p.dualOf[gi], t)
		}
	}
	return nil
}

// Graph returns the graph the program was compiled from.
func (p *Program) Graph() *G.ExprGraph { return p.g }

// Nodes returns the program's nodes in the order Workers(1) runs them.
func (p *Program) Nodes() G.Nodes { return append(G.Nodes(nil), p.nodes...) }

// Inputs returns the nodes whose values are bound rather than computed.
func (p *Program) Inputs() G.Nodes {
	out := make(G.Nodes, len(p.inputs))
	for i, in := range p.inputs {
		out[i] = p.nodes[in]
	}
	return out
}

// Has reports whether n is one of the program's nodes.
func (p *Program) Has(n *G.Node) bool { _, ok := p.index[n]; return ok }

// GradNode returns the gradient node of wrt: the one given to WithGrads, or
// else gorgonia's wrt.Deriv(). It returns nil when wrt has none.
func (p *Program) GradNode(wrt *G.Node) *G.Node {
	if g, ok := p.gradOf[wrt]; ok {
		return g
	}
	if wrt == nil {
		return nil
	}
	if d := wrt.Deriv(); d != nil {
		if _, ok := p.index[d]; ok {
			return d
		}
	}
	return nil
}

func containsBefore(s []int32, j int, v int32) bool {
	for _, x := range s[:j] {
		if x == v {
			return true
		}
	}
	return false
}

func containsNode(s []*G.Node, n *G.Node) bool {
	for _, x := range s {
		if x == n {
			return true
		}
	}
	return false
}
