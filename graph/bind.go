package graph

import (
	"fmt"

	G "gorgonia.org/gorgonia"
)

// A Binding gives input nodes their values for a Run. Bindings are applied
// with gorgonia.Let, so the node keeps the value afterwards (n.Value()
// returns it) and later runs without a binding for it reuse it.
type Binding interface {
	apply(p *Program) error
}

type nodeBinding struct {
	n *G.Node
	v any
}

// Bind binds v to the input node n for a Run. v is a gorgonia.Value (for
// example a *tensor.Dense) or anything gorgonia.Let accepts; its shape and
// dtype must match the node's.
func Bind(n *G.Node, v any) Binding { return nodeBinding{n, v} }

func (b nodeBinding) apply(p *Program) error { return p.bindInput(b.n, b.v) }

// Values binds every node of m to its value, as Bind does for one.
type Values map[*G.Node]G.Value

func (m Values) apply(p *Program) error {
	for n, v := range m {
		if err := p.bindInput(n, v); err != nil {
			return err
		}
	}
	return nil
}

func (p *Program) bindInput(n *G.Node, v any) error {
	i, ok := p.index[n]
	if !ok {
		return fmt.Errorf("graph: Bind: node %v is not in the program: %w", n, ErrInvalidArgument)
	}
	if p.kind[i] != kindInput {
		return fmt.Errorf("graph: Bind: node %q is computed by the program, not an input: %w", n.Name(), ErrInvalidArgument)
	}
	if v == nil {
		return fmt.Errorf("graph: Bind: nil value for node %q: %w", n.Name(), ErrInvalidArgument)
	}
	if err := G.Let(n, v); err != nil {
		return fmt.Errorf("graph: Bind: node %q: %v: %w", n.Name(), err, ErrInvalidArgument)
	}
	return nil
}
