package dist

import (
	"errors"

	"github.com/tandemml/tandem/comm"
)

// ErrNotDifferentiable is wrapped by the error a collective's SymDiff returns
// when asked for a gradient it does not have: bitwise reductions (band, bor,
// bxor), integer tensors, and second derivatives of product, min and max.
// gorgonia.Grad and gorgonia.Backpropagate pass that error on, naming the node.
var ErrNotDifferentiable = errors.New("dist: not differentiable")

// ErrInvalidArgument is comm.ErrInvalidArgument, the shared Tandem sentinel,
// wrapped by every error about a malformed call (nil group or node, wrong
// list length, shapes or dtypes that differ, a root or split out of range).
var ErrInvalidArgument = comm.ErrInvalidArgument
