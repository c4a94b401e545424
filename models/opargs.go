package models

import (
	"fmt"

	G "gorgonia.org/gorgonia"
	"gorgonia.org/tensor"

	"github.com/tandemml/tandem/internal/opkit"
)

// This file holds what the package's gorgonia ops share beyond
// internal/opkit: the arity test at the top of InferShape, Do and
// UsePreallocDo, and the unpacking of their shapes and values. The helpers
// are generic over the op's type so that the op is turned into an interface
// (and so allocated) only on the error path, never in a hot Do.

// checkArity reports an error naming op when it was handed got inputs but takes want.
func checkArity[O fmt.Stringer](op O, got, want int) error {
	return opkit.CheckArity("models", op, got, want)
}

// firstShape is InferShape for an op of want inputs whose output has the
// shape of its first input.
func firstShape[O fmt.Stringer](op O, in []G.DimSizer, want int) (tensor.Shape, error) {
	if err := checkArity(op, len(in), want); err != nil {
		return nil, err
	}
	s, err := shapeOf(in[0])
	return s.Clone(), err
}

// twoShapes unpacks the shapes handed to the InferShape of an op of two inputs.
func twoShapes[O fmt.Stringer](op O, in []G.DimSizer) (a, b tensor.Shape, err error) {
	if err = checkArity(op, len(in), 2); err != nil {
		return nil, nil, err
	}
	if a, err = shapeOf(in[0]); err != nil {
		return nil, nil, err
	}
	if b, err = shapeOf(in[1]); err != nil {
		return nil, nil, err
	}
	return a, b, nil
}

// oneValue unpacks the dense input of an op of one input.
func oneValue[O fmt.Stringer](op O, in []G.Value) (*tensor.Dense, error) {
	if err := checkArity(op, len(in), 1); err != nil {
		return nil, err
	}
	return denseOf(in[0])
}

// twoValues unpacks the dense inputs of an op of two inputs; it checks
// neither their dtypes nor their shapes (see twoDense).
func twoValues[O fmt.Stringer](op O, in []G.Value) (a, b *tensor.Dense, err error) {
	if err = checkArity(op, len(in), 2); err != nil {
		return nil, nil, err
	}
	if a, err = denseOf(in[0]); err != nil {
		return nil, nil, err
	}
	if b, err = denseOf(in[1]); err != nil {
		return nil, nil, err
	}
	return a, b, nil
}
