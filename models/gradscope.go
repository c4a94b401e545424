package models

import (
	G "gorgonia.org/gorgonia"
)

// gradScope tells the ops a Builder created which of their inputs need a
// gradient while Builder.Backward differentiates: gorgonia asks an op
// (DiffWRT) which inputs it can differentiate and builds a gradient node for
// each, wanted or not, and nothing downstream removes an unwanted one. An op
// whose input depends on no parameter being differentiated (a bound data
// batch) says no for it and builds nothing: the Linear layer reading the
// batch then costs two GEMMs backward instead of three.
//
// Outside Backward (gorgonia.Grad called directly, say to differentiate with
// respect to a bound input) the scope is closed and every op differentiates
// every input, as gorgonia expects.
type gradScope struct {
	active map[*G.Node]bool // nodes that depend on a differentiated node; nil when closed
}

// open marks the nodes of g that depend on any of wrt.
func (s *gradScope) open(g *G.ExprGraph, wrt []*G.Node) error {
	sorted, err := G.Sort(g)
	if err != nil {
		return err
	}
	active := make(map[*G.Node]bool, len(sorted))
	for _, n := range wrt {
		active[n] = true
	}
	// G.Sort lists consumers before the nodes they read.
	for i := len(sorted) - 1; i >= 0; i-- {
		n := sorted[i]
		if active[n] {
			continue
		}
		for it := g.From(n.ID()); it.Next(); {
			if c, ok := it.Node().(*G.Node); ok && active[c] {
				active[n] = true
				break
			}
		}
	}
	s.active = active
	return nil
}

func (s *gradScope) close() { s.active = nil }

// inputGrads is held by an op built through a Builder: its input nodes and
// the Builder's scope.
type inputGrads struct {
	scope *gradScope
	in    []*G.Node
}

// newInputGrads returns the record for an op of b reading in.
func newInputGrads(b *Builder, in ...*G.Node) *inputGrads {
	if b == nil {
		return nil
	}
	return &inputGrads{scope: b.scope, in: in}
}

// need reports whether input j needs a gradient: always, unless the scope
// is open and input j depends on no differentiated node.
func (g *inputGrads) need(j int) bool {
	if g == nil || g.scope == nil || g.scope.active == nil || j >= len(g.in) {
		return true
	}
	return g.scope.active[g.in[j]]
}
