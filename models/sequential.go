package models

import (
	"fmt"
	"strconv"
	"strings"

	G "gorgonia.org/gorgonia"

	"github.com/tandemml/tandem/internal/errs"
)

// Sequential applies its children in order, like torch.nn.Sequential. The
// children are named "0", "1", ... by position (activations included), so a
// Linear at position 2 owns "2.weight" and "2.bias"; NewNamedSequential
// gives them names instead ("conv1.weight"), like a Sequential built from an
// OrderedDict or a PyTorch module with attributes applied in order.
type Sequential struct {
	Layers []Module
	Names  []string // child names, parallel to Layers
}

// NewSequential returns a Sequential over layers, prefixing each child's
// tensor names with its index. A module must not be added to two containers.
// A nil layer is a programming error and panics.
func NewSequential(layers ...Module) *Sequential {
	names := make([]string, len(layers))
	for i := range layers {
		names[i] = strconv.Itoa(i)
	}
	s, err := newSequential(layers, names)
	if err != nil {
		panic(err)
	}
	return s
}

// Child is a module with its name in a container.
type Child struct {
	Name   string
	Module Module
}

// NewNamedSequential returns a Sequential applying the children in order,
// prefixing each child's tensor names with its name. Names must be unique,
// non-empty and free of dots.
func NewNamedSequential(children ...Child) (*Sequential, error) {
	layers := make([]Module, len(children))
	names := make([]string, len(children))
	seen := map[string]bool{}
	for i, c := range children {
		if c.Name == "" || strings.Contains(c.Name, ".") || seen[c.Name] || c.Module == nil {
			return nil, fmt.Errorf("models: child %d has an empty, dotted, repeated name or no module (%q): %w", i, c.Name, errs.InvalidArgument)
		}
		seen[c.Name] = true
		layers[i], names[i] = c.Module, c.Name
	}
	return newSequential(layers, names)
}

func newSequential(layers []Module, names []string) (*Sequential, error) {
	s := &Sequential{Layers: layers, Names: names}
	for i, m := range layers {
		if m == nil {
			return nil, fmt.Errorf("models: Sequential child %s has no module: %w", names[i], errs.InvalidArgument)
		}
		if err := NameChild(names[i], m); err != nil {
			return nil, err
		}
	}
	return s, nil
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

// Forward feeds x through the children in order. A Linear or Conv2d
// directly followed by a ReLU is built as one layer whose bias and ReLU take
// a single pass over the output (forward and backward); the result and the
// parameter names are those of the two layers applied one after the other.
func (s *Sequential) Forward(b *Builder, x *G.Node) (*G.Node, error) {
	var err error
	for i := 0; i < len(s.Layers); i++ {
		m := s.Layers[i]
		if f, ok := m.(reluFuser); ok && i+1 < len(s.Layers) && isReLU(s.Layers[i+1]) {
			if x, err = f.forwardReLU(b, x); err != nil {
				return nil, fmt.Errorf("layers %s (%T) and %s (ReLU): %w", s.name(i), m, s.name(i+1), err)
			}
			i++
			continue
		}
		if x, err = m.Forward(b, x); err != nil {
			return nil, fmt.Errorf("layer %s (%T): %w", s.name(i), m, err)
		}
	}
	return x, nil
}

// reluFuser is a layer that can apply a ReLU to its output in the same pass
// as its bias.
type reluFuser interface {
	forwardReLU(b *Builder, x *G.Node) (*G.Node, error)
}

func isReLU(m Module) bool {
	switch m.(type) {
	case ReLU, *ReLU:
		return true
	}
	return false
}

func (s *Sequential) name(i int) string {
	if i < len(s.Names) {
		return s.Names[i]
	}
	return strconv.Itoa(i)
}
