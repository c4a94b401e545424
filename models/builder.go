package models

import (
	"errors"
	"fmt"
	"math/rand/v2"

	G "gorgonia.org/gorgonia"
	"gorgonia.org/tensor"

	"github.com/tandemml/tandem/graph"
	"github.com/tandemml/tandem/internal/errs"
)

// Mode selects training or evaluation behaviour of Dropout and BatchNorm2d.
type Mode int

const (
	// Train: Dropout drops, BatchNorm2d normalises with batch statistics and
	// updates its running statistics. The default, as in PyTorch.
	Train Mode = iota
	// Eval: Dropout is the identity, BatchNorm2d uses its running statistics.
	Eval
)

func (m Mode) String() string {
	if m == Eval {
		return "eval"
	}
	return "train"
}

// BuilderOption configures a Builder.
type BuilderOption func(*Builder)

// WithMode sets training or evaluation mode (default Train).
func WithMode(m Mode) BuilderOption { return func(b *Builder) { b.mode = m } }

// WithBuilderRand sets the generator that seeds the graph's random ops
// (Dropout masks). Each random op gets its own generator seeded from it at
// build time, so runs are reproducible and ops never share one.
func WithBuilderRand(r *rand.Rand) BuilderOption { return func(b *Builder) { b.rng = r } }

// Builder adds modules to one gorgonia graph. It binds each Param's Value
// tensor to exactly one input node of the graph, so optimizers and broadcasts
// that update Value in place take effect on the next run without rebuilding;
// after Backward it knows each parameter's gradient node and copies the
// computed gradients into Param.Grad.
//
// A Builder is not safe for concurrent use while building; running the
// finished graph is the executor's business.
type Builder struct {
	g     *G.ExprGraph
	mode  Mode
	rng   *rand.Rand
	nodes map[*Param]*G.Node
	bound []*Param // binding order
	grads map[*Param]*G.Node
	ids   int
	scope *gradScope // which inputs need gradients, while Backward runs
	// inPlace: gradient ops write into Param.Grad (WithGradsInPlace).
	inPlace bool
	// prog: the program last compiled with Compile, which WithGradsInPlace
	// points at Param.Grad.
	prog *graph.Program
	// fuseLR: the learning rate of plain SGD fused into the backward pass
	// (WithSGDInBackward), 0 for none; fused: the parameters the program
	// last compiled updates itself.
	fuseLR float64
	fused  map[*Param]bool
}

// NewBuilder returns a Builder that adds nodes to g (a new graph if g is nil).
func NewBuilder(g *G.ExprGraph, opts ...BuilderOption) *Builder {
	if g == nil {
		g = G.NewGraph()
	}
	b := &Builder{g: g, nodes: map[*Param]*G.Node{}, grads: map[*Param]*G.Node{}, scope: &gradScope{}}
	for _, o := range opts {
		o(b)
	}
	if b.rng == nil {
		b.rng = rand.New(rand.NewPCG(DefaultSeed, 1))
	}
	return b
}

// Graph returns the graph being built.
func (b *Builder) Graph() *G.ExprGraph { return b.g }

// Mode returns the builder's mode.
func (b *Builder) Mode() Mode { return b.mode }

// Training reports whether the builder is in Train mode.
func (b *Builder) Training() bool { return b.mode == Train }

// nextID returns a number unique within this builder, used to keep stateful
// ops (random masks, running statistics) distinct in gorgonia's node hashing.
func (b *Builder) nextID() int { b.ids++; return b.ids }

// newRand returns a generator for one random op, seeded from the builder's.
func (b *Builder) newRand() *rand.Rand {
	return rand.New(rand.NewPCG(b.rng.Uint64(), b.rng.Uint64()))
}

// Node returns the graph node bound to p's Value, creating it the first time.
// The node is named after p and holds p.Value itself (no copy).
func (b *Builder) Node(p *Param) (*G.Node, error) {
	if n, ok := b.nodes[p]; ok {
		return n, nil
	}
	if p == nil || p.Value == nil {
		return nil, fmt.Errorf("models: binding a parameter without a value: %w", errs.InvalidArgument)
	}
	n := b.Bind(p.Name, p.Value)
	b.nodes[p] = n
	b.bound = append(b.bound, p)
	return n, nil
}

// Bind returns a new input node holding t itself (no copy), named name. Use
// it for inputs and targets: refill t in place and rerun the graph.
//
// gorgonia merges input nodes of equal name, type and shape, so when name is
// already taken in the graph, Bind appends "#2", "#3", ... to keep the nodes
// (and the tensors behind them) apart.
func (b *Builder) Bind(name string, t *tensor.Dense) *G.Node {
	name = b.uniqueName(name)
	shape := t.Shape()
	if t.IsScalar() {
		return G.NewScalar(b.g, t.Dtype(), G.WithName(name), G.WithValue(t))
	}
	return G.NewTensor(b.g, t.Dtype(), len(shape), G.WithShape(shape.Clone()...), G.WithName(name), G.WithValue(t))
}

func (b *Builder) uniqueName(name string) string {
	if len(b.g.ByName(name)) == 0 {
		return name
	}
	for k := 2; ; k++ {
		if n := fmt.Sprintf("%s#%d", name, k); len(b.g.ByName(n)) == 0 {
			return n
		}
	}
}

// Params returns the bound parameters that require gradients, in binding
// order (the order Forward first used them); ParamNodes is parallel to it.
func (b *Builder) Params() []*Param {
	var out []*Param
	for _, p := range b.bound {
		if p.RequiresGrad {
			out = append(out, p)
		}
	}
	return out
}

// ParamNodes returns the nodes of Params(), in the same order: the "wrt"
// argument for G.Grad.
func (b *Builder) ParamNodes() []*G.Node {
	ps := b.Params()
	out := make([]*G.Node, len(ps))
	for i, p := range ps {
		out[i] = b.nodes[p]
	}
	return out
}

// Backward adds the gradient of the scalar loss with respect to every bound
// parameter that requires gradients and influences loss. Parameters that do
// not influence loss get no gradient node (their Grad is left alone, like
// PyTorch leaving .grad unset for unused parameters).
//
// Backward builds no gradient for an input that does not depend on a
// parameter being differentiated (the data batch fed to the first Linear or
// Conv2d layer): like PyTorch, which computes no gradient for a tensor that
// does not require one, it spares the executor a GEMM per such input. Call
// gorgonia.Grad directly to differentiate with respect to bound inputs.
func (b *Builder) Backward(loss *G.Node) error {
	if loss == nil || !loss.IsScalar() {
		return fmt.Errorf("models: Backward needs a scalar loss node: %w", errs.InvalidArgument)
	}
	ps := b.Params()
	nodes := make([]*G.Node, 0, len(ps))
	owner := make(map[*G.Node]*Param, len(ps))
	for _, p := range ps {
		nodes = append(nodes, b.nodes[p])
		owner[b.nodes[p]] = p
	}
	for len(nodes) > 0 {
		if err := b.scope.open(b.g, nodes); err != nil {
			return fmt.Errorf("models: differentiating the loss: %w", err)
		}
		grads, err := G.Grad(loss, nodes...)
		b.scope.close()
		if err == nil {
			for i, n := range nodes {
				b.grads[owner[n]] = grads[i]
			}
			if b.inPlace {
				for _, n := range nodes {
					if p := owner[n]; !(b.fuseLR > 0 && b.fuses(p)) {
						b.sink(p)
					}
				}
			}
			return nil
		}
		var sde G.SymDiffError
		if !errors.As(err, &sde) || len(sde.Nodes()) == 0 {
			return fmt.Errorf("models: differentiating the loss: %w", err)
		}
		unused := map[*G.Node]bool{}
		for _, n := range sde.Nodes() {
			unused[n] = true
		}
		kept := nodes[:0]
		for _, n := range nodes {
			if !unused[n] {
				kept = append(kept, n)
			}
		}
		if len(kept) == len(nodes) {
			return fmt.Errorf("models: differentiating the loss: %w", err)
		}
		nodes = kept
	}
	return nil
}

// GradNode returns the node holding p's gradient after Backward, or nil when
// p has none (not bound, not requiring gradients, or not influencing the loss).
func (b *Builder) GradNode(p *Param) *G.Node { return b.grads[p] }

// GradNodes returns the gradient nodes in the order of GradParams.
func (b *Builder) GradNodes() []*G.Node {
	ps := b.GradParams()
	out := make([]*G.Node, len(ps))
	for i, p := range ps {
		out[i] = b.grads[p]
	}
	return out
}

// GradParams returns the parameters that have a gradient node, in binding order.
func (b *Builder) GradParams() []*Param {
	var out []*Param
	for _, p := range b.bound {
		if _, ok := b.grads[p]; ok {
			out = append(out, p)
		}
	}
	return out
}

// CopyGrads copies each gradient node's value (computed by the last run)
// into its Param.Grad, allocating Grad on first use and overwriting it after.
// With WithGradsInPlace the run has already written most gradients there,
// and only the others are copied.
func (b *Builder) CopyGrads() error { return b.moveGrads(false) }

// AccumulateGrads adds each gradient node's value into its Param.Grad
// (allocating a zero Grad first if needed), like PyTorch's accumulation
// across backward passes.
func (b *Builder) AccumulateGrads() error { return b.moveGrads(true) }

func (b *Builder) moveGrads(add bool) error {
	if add && b.inPlace {
		return fmt.Errorf("models: AccumulateGrads: this Builder writes gradients in place (WithGradsInPlace), so every run overwrites Param.Grad; build without that option to accumulate: %w", errs.InvalidArgument)
	}
	for _, p := range b.GradParams() {
		n := b.grads[p]
		v := n.Value()
		if v == nil {
			return fmt.Errorf("models: gradient of %s has no value; run the graph before copying gradients: %w", p.Name, errs.InvalidArgument)
		}
		if b.inPlace && p.Grad != nil && sameMemory(v, p.Grad) {
			continue // the run wrote it there
		}
		if b.fused[p] {
			continue // the run updated the parameter and kept no gradient
		}
		src, err := gradDense(v, p.Value.Dtype(), p.Value.Shape())
		if err != nil {
			return fmt.Errorf("models: gradient of %s: %w", p.Name, err)
		}
		if p.Grad == nil || !p.Grad.Shape().Eq(p.Value.Shape()) || p.Grad.Dtype() != p.Value.Dtype() {
			p.Grad = newDense(p.Value.Dtype(), p.Value.Shape()...)
		}
		switch d := p.Grad.Data().(type) {
		case []float64:
			addOrCopy(d, src.Float64s(), add)
		case []float32:
			addOrCopy(d, src.Float32s(), add)
		default:
			return fmt.Errorf("models: gradient of %s: unsupported dtype %v: %w", p.Name, p.Grad.Dtype(), errs.InvalidArgument)
		}
		if b.inPlace {
			b.sink(p) // Grad was replaced, or the op could not use it: point it there again
		}
	}
	return nil
}

// sameMemory reports whether two values cover exactly the same memory.
func sameMemory(a G.Value, b *tensor.Dense) bool {
	return a.Uintptr() == b.Uintptr() && a.MemSize() == b.MemSize()
}

func addOrCopy[T float](dst, src []T, add bool) {
	if !add {
		copy(dst, src)
		return
	}
	for i, v := range src {
		dst[i] += v
	}
}

// gradDense turns a gradient value into a contiguous dense tensor of the
// parameter's dtype and size.
func gradDense(v G.Value, dt tensor.Dtype, shape tensor.Shape) (*tensor.Dense, error) {
	if d, ok := v.(*tensor.Dense); ok {
		t, err := denseOf(d)
		if err != nil {
			return nil, err
		}
		if t.Dtype() != dt || t.Size() != shape.TotalSize() {
			return nil, fmt.Errorf("value of dtype %v shape %v where dtype %v shape %v was expected: %w", t.Dtype(), t.Shape(), dt, shape, errs.InvalidArgument)
		}
		if t.IsScalar() {
			x, err := scalarOf(t)
			if err != nil {
				return nil, err
			}
			return scalarDense(dt, x), nil
		}
		return t, nil
	}
	x, err := scalarOf(v)
	if err != nil {
		return nil, err
	}
	return scalarDense(dt, x), nil
}

func scalarDense(dt tensor.Dtype, x float64) *tensor.Dense {
	if dt == tensor.Float32 {
		return tensor.New(tensor.WithShape(1), tensor.WithBacking([]float32{float32(x)}))
	}
	return tensor.New(tensor.WithShape(1), tensor.WithBacking([]float64{x}))
}
