package models

import (
	"fmt"

	G "gorgonia.org/gorgonia"
	"gorgonia.org/tensor"

	"github.com/tandemml/tandem/internal/errs"
)

// float is the element type of every floating-point kernel in this package.
type float interface{ ~float32 | ~float64 }

// denseOf returns v as a contiguous dense tensor, materialising views.
func denseOf(v G.Value) (*tensor.Dense, error) {
	t, ok := v.(*tensor.Dense)
	if !ok {
		return nil, fmt.Errorf("models: expected a *tensor.Dense value, got %T: %w", v, errs.InvalidArgument)
	}
	if t.RequiresIterator() || t.IsView() {
		m, ok := t.Materialize().(*tensor.Dense)
		if !ok {
			return nil, fmt.Errorf("models: cannot materialise a view of shape %v: %w", t.Shape(), errs.InvalidArgument)
		}
		return m, nil
	}
	return t, nil
}

// sliceOf returns the backing slice of a contiguous dense tensor of element type T.
func sliceOf[T float](t *tensor.Dense) ([]T, error) {
	if t.IsScalar() {
		switch d := t.Data().(type) {
		case T:
			return []T{d}, nil
		case []T:
			return d, nil
		}
		return nil, fmt.Errorf("models: scalar of dtype %v where %T was expected: %w", t.Dtype(), T(0), errs.InvalidArgument)
	}
	d, ok := t.Data().([]T)
	if !ok {
		return nil, fmt.Errorf("models: tensor of dtype %v where %T was expected: %w", t.Dtype(), T(0), errs.InvalidArgument)
	}
	return d, nil
}

// scalarOf reads a scalar Value (gorgonia's *F64/*F32, or a one-element tensor).
func scalarOf(v G.Value) (float64, error) {
	switch s := v.(type) {
	case *G.F64:
		return float64(*s), nil
	case *G.F32:
		return float64(*s), nil
	case *tensor.Dense:
		if s.Size() != 1 {
			return 0, fmt.Errorf("models: expected a scalar, got a tensor of shape %v: %w", s.Shape(), errs.InvalidArgument)
		}
		d, err := denseOf(s)
		if err != nil {
			return 0, err
		}
		switch x := d.Data().(type) {
		case float64:
			return x, nil
		case float32:
			return float64(x), nil
		case []float64:
			return x[0], nil
		case []float32:
			return float64(x[0]), nil
		}
		return 0, fmt.Errorf("models: expected a floating-point scalar, got dtype %v: %w", s.Dtype(), errs.InvalidArgument)
	}
	return 0, fmt.Errorf("models: expected a scalar value, got %T: %w", v, errs.InvalidArgument)
}

// scalarValue wraps x as a gorgonia scalar of dtype dt.
func scalarValue(dt tensor.Dtype, x float64) (G.Value, error) {
	switch dt {
	case tensor.Float64:
		return G.NewF64(x), nil
	case tensor.Float32:
		return G.NewF32(float32(x)), nil
	}
	return nil, fmt.Errorf("models: unsupported dtype %v (want float32 or float64): %w", dt, errs.InvalidArgument)
}

// checkFloat reports whether dt is a dtype the layers compute in.
func checkFloat(dt tensor.Dtype) error {
	if dt != tensor.Float32 && dt != tensor.Float64 {
		return fmt.Errorf("models: unsupported dtype %v (want float32 or float64): %w", dt, errs.InvalidArgument)
	}
	return nil
}

// newLike allocates a zeroed dense tensor of dtype dt and the given shape.
func newDense(dt tensor.Dtype, shape ...int) *tensor.Dense {
	return tensor.New(tensor.Of(dt), tensor.WithShape(shape...))
}

// shapeOf returns the shape behind a DimSizer handed to InferShape.
func shapeOf(d G.DimSizer) (tensor.Shape, error) {
	s, ok := d.(tensor.Shape)
	if !ok {
		return nil, fmt.Errorf("models: expected a tensor.Shape, got %T: %w", d, errs.InvalidArgument)
	}
	return s, nil
}

// outDense returns the tensor an op writes its result into: prealloc itself
// when it can hold the result (a contiguous *tensor.Dense that is not a
// view, of dtype dt and exactly the given shape, sharing no memory with any
// of the op's inputs), else a new zeroed tensor. Executors that reuse
// buffers (the graph package, gorgonia's TapeMachine) hand ops the value they
// returned in the previous run; writing into it saves allocating and
// clearing the output every run. A reused tensor holds stale values: kernels
// writing into it must overwrite every element (or clear it first).
func outDense(prealloc G.Value, dt tensor.Dtype, shape []int, inputs ...G.Value) *tensor.Dense {
	if d := reusable(prealloc, dt, shape, inputs); d != nil {
		return d
	}
	return newDense(dt, shape...)
}

// reusable returns prealloc as a dense tensor when outDense may write into it.
func reusable(prealloc G.Value, dt tensor.Dtype, shape []int, inputs []G.Value) *tensor.Dense {
	d, ok := prealloc.(*tensor.Dense)
	if !ok || d == nil || d.Dtype() != dt || d.IsView() || d.RequiresIterator() || d.IsScalar() || !d.Shape().Eq(tensor.Shape(shape)) {
		return nil
	}
	if overlapsAny(d, inputs) {
		return nil
	}
	return d
}

// overlapsAny reports whether v's memory overlaps that of any of inputs.
func overlapsAny(v G.Value, inputs []G.Value) bool {
	lo := v.Uintptr()
	hi := lo + v.MemSize()
	for _, in := range inputs {
		if in == nil {
			continue
		}
		l := in.Uintptr()
		if l < hi && lo < l+in.MemSize() {
			return true
		}
	}
	return false
}
