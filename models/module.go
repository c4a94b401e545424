package models

import (
	G "gorgonia.org/gorgonia"
)

// Module is a layer or a model. It owns Params (its learnable tensors and
// those of its children) and Buffers (state that is saved but not learned,
// such as BatchNorm's running statistics), and builds its computation into a
// graph on demand. Forward only adds nodes to b's graph; running the graph
// (gorgonia's TapeMachine or the graph package's executor) is the caller's
// business, so a module works under any executor.
//
// Names follow PyTorch's state_dict: a leaf names its tensors "weight",
// "bias", "running_mean", ...; a container prefixes its children's names with
// the child's name and a dot ("0.weight"). A module belongs to at most one
// container, because adding it renames its tensors.
type Module interface {
	// Params returns the learnable parameters in state_dict order.
	Params() []*Param
	// Buffers returns the non-learnable state in state_dict order.
	Buffers() []*Param
	// Forward adds the module's computation on x to b's graph and returns
	// the output node.
	Forward(b *Builder, x *G.Node) (*G.Node, error)
}

// StateDicter is implemented by modules whose state_dict order is not simply
// their parameters followed by their buffers (containers interleave their
// children's entries). StateDict uses it when present.
type StateDicter interface {
	StateDict() []*Param
}

// StateDict returns m's parameters and buffers in PyTorch's state_dict order:
// for each module, its own parameters, then its own buffers, then its children
// in order, recursively. The entries are the module's own *Param values, so
// writing into their Value tensors changes the model.
func StateDict(m Module) []*Param {
	if s, ok := m.(StateDicter); ok {
		return s.StateDict()
	}
	ps, bs := m.Params(), m.Buffers()
	out := make([]*Param, 0, len(ps)+len(bs))
	out = append(out, ps...)
	return append(out, bs...)
}

// Func is a stateless module made from a function, for reshapes and
// activations written by the user.
type Func func(b *Builder, x *G.Node) (*G.Node, error)

// Params returns nothing: a Func has no parameters.
func (f Func) Params() []*Param { return nil }

// Buffers returns nothing: a Func has no buffers.
func (f Func) Buffers() []*Param { return nil }

// Forward calls f.
func (f Func) Forward(b *Builder, x *G.Node) (*G.Node, error) { return f(b, x) }
