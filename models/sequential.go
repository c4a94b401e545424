package models

import (
	"fmt"
	"strconv"

	G "gorgonia.org/gorgonia"
)

// Sequential applies its children in order, like torch.nn.Sequential. The
// children are named "0", "1", ... by position (activations included), so a
// Linear at position 2 owns "2.weight" and "2.bias".
type Sequential struct {
	Layers []Module
}

// NewSequential returns a Sequential over layers, prefixing each child's
// tensor names with its index. A module must not be added to two containers.
func NewSequential(layers ...Module) *Sequential {
	s := &Sequential{Layers: layers}
	for i, m := range layers {
		prefixNames(strconv.Itoa(i), m)
	}
	return s
}

// prefixNames renames every tensor of m to prefix + "." + name.
func prefixNames(prefix string, m Module) {
	for _, p := range StateDict(m) {
		p.Name = prefix + "." + p.Name
	}
}

// Params returns the children's parameters in order.
func (s *Sequential) Params() []*Param {
	var out []*Param
	for _, m := range s.Layers {
		out = append(out, m.Params()...)
	}
	return out
}

// Buffers returns the children's buffers in order.
func (s *Sequential) Buffers() []*Param {
	var out []*Param
	for _, m := range s.Layers {
		out = append(out, m.Buffers()...)
	}
	return out
}

// StateDict returns each child's state_dict in turn.
func (s *Sequential) StateDict() []*Param {
	var out []*Param
	for _, m := range s.Layers {
		out = append(out, StateDict(m)...)
	}
	return out
}

// Forward feeds x through the children in order.
func (s *Sequential) Forward(b *Builder, x *G.Node) (*G.Node, error) {
	var err error
	for i, m := range s.Layers {
		if x, err = m.Forward(b, x); err != nil {
			return nil, fmt.Errorf("layer %d (%T): %w", i, m, err)
		}
	}
	return x, nil
}
