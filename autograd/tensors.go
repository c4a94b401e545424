package autograd

import (
	"fmt"

	G "gorgonia.org/gorgonia"
	"gorgonia.org/tensor"
)

// reshapedCopy returns a contiguous copy of g with the given shape (same
// number of elements).
func reshapedCopy(g *tensor.Dense, shape tensor.Shape) *tensor.Dense {
	var c *tensor.Dense
	if g.RequiresIterator() {
		if d, ok := g.Materialize().(*tensor.Dense); ok && d != g {
			c = d
		}
	}
	if c == nil {
		c = g.Clone().(*tensor.Dense)
	}
	if !c.Shape().Eq(shape) && c.Shape().TotalSize() == shape.TotalSize() {
		if len(shape) == 0 {
			c = tensor.New(tensor.Of(c.Dtype()), tensor.FromScalar(firstElem(c)))
		} else if err := c.Reshape(shape.Clone()...); err != nil {
			panic(fmt.Sprintf("autograd: reshape %v to %v: %v", c.Shape(), shape, err))
		}
	}
	return c
}

func firstElem(t *tensor.Dense) any {
	switch d := t.Data().(type) {
	case []float64:
		return d[0]
	case []float32:
		return d[0]
	case float64, float32:
		return d
	}
	return t.Data()
}

// addInto adds src to dst element-wise (same dtype and number of elements).
func addInto(dst, src *tensor.Dense) error {
	if dst.Dtype() != src.Dtype() || dst.Shape().TotalSize() != src.Shape().TotalSize() {
		return fmt.Errorf("%w: autograd: adding a gradient of %v %v to one of %v %v", ErrInvalidArgument, src.Dtype(), src.Shape(), dst.Dtype(), dst.Shape())
	}
	if src.RequiresIterator() {
		src = reshapedCopy(src, src.Shape())
	}
	switch d := dst.Data().(type) {
	case []float64:
		s := src.Data().([]float64)
		for i := range d {
			d[i] += s[i]
		}
	case []float32:
		s := src.Data().([]float32)
		for i := range d {
			d[i] += s[i]
		}
	case float64, float32:
		// a scalar tensor: its backing is one element
		switch dst.Dtype() {
		case tensor.Float64:
			dst.Float64s()[0] += src.Float64s()[0]
		case tensor.Float32:
			dst.Float32s()[0] += src.Float32s()[0]
		}
	default:
		return fmt.Errorf("%w: autograd: gradients must be float32 or float64, got %v", ErrInvalidArgument, dst.Dtype())
	}
	return nil
}

// filled returns a tensor shaped like t filled with v.
func filled(t *tensor.Dense, v float64) *tensor.Dense {
	if len(t.Shape()) == 0 {
		if t.Dtype() == tensor.Float32 {
			return tensor.New(tensor.FromScalar(float32(v)))
		}
		return tensor.New(tensor.FromScalar(v))
	}
	out := tensor.New(tensor.Of(t.Dtype()), tensor.WithShape(t.Shape().Clone()...))
	if v != 0 {
		switch d := out.Data().(type) {
		case []float64:
			for i := range d {
				d[i] = v
			}
		case []float32:
			for i := range d {
				d[i] = float32(v)
			}
		}
	}
	return out
}

func isFloat(dt tensor.Dtype) bool { return dt == tensor.Float64 || dt == tensor.Float32 }

// valueDense turns a gorgonia value into a new contiguous dense tensor of
// the given shape (its own memory, safe to keep after the program runs
// again).
func valueDense(v G.Value, shape tensor.Shape) (*tensor.Dense, error) {
	switch x := v.(type) {
	case *tensor.Dense:
		if x.Shape().TotalSize() != shape.TotalSize() {
			return nil, fmt.Errorf("autograd: value of shape %v where %v was expected", x.Shape(), shape)
		}
		return reshapedCopy(x, shape), nil
	case *G.F64:
		return shapedScalar(float64(*x), shape, tensor.Float64), nil
	case *G.F32:
		return shapedScalar(float64(*x), shape, tensor.Float32), nil
	}
	return nil, fmt.Errorf("autograd: value of type %T cannot be a tensor", v)
}

func shapedScalar(x float64, shape tensor.Shape, dt tensor.Dtype) *tensor.Dense {
	if len(shape) == 0 {
		if dt == tensor.Float32 {
			return tensor.New(tensor.FromScalar(float32(x)))
		}
		return tensor.New(tensor.FromScalar(x))
	}
	if dt == tensor.Float32 {
		return tensor.New(tensor.WithShape(shape.Clone()...), tensor.WithBacking([]float32{float32(x)}))
	}
	return tensor.New(tensor.WithShape(shape.Clone()...), tensor.WithBacking([]float64{x}))
}

// bindable turns a tensor into a value an input node of the given shape
// accepts: scalar nodes take gorgonia scalars.
func bindable(t *tensor.Dense, scalarNode bool) G.Value {
	if !scalarNode {
		return t
	}
	switch t.Dtype() {
	case tensor.Float32:
		return G.NewF32(t.Float32s()[0])
	case tensor.Float64:
		return G.NewF64(t.Float64s()[0])
	}
	return t
}
