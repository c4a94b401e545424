package dist

import (
	"fmt"

	"github.com/chewxy/hm"
	G "gorgonia.org/gorgonia"
	"gorgonia.org/tensor"

	"github.com/tandemml/tandem/internal/flat"
)

// This file holds the plumbing between gorgonia values and the flat,
// contiguous buffers that comm's collectives move.

// The buffers are raw slices ([]float32, []int64, ...) held as any, so that
// they go straight into tensor.WithBacking; internal/flat does the typed
// work on them.

// supported reports whether comm can move tensors of dtype dt.
func supported(dt tensor.Dtype) bool { return flat.Supported(dt) }

// isFloat reports whether dt has gradients.
func isFloat(dt tensor.Dtype) bool { return dt == tensor.Float32 || dt == tensor.Float64 }

// newFlat returns a zeroed buffer of n elements of dtype dt.
func newFlat(dt tensor.Dtype, n int) any {
	b, ok := flat.New(dt, n)
	if !ok {
		panic(fmt.Sprintf("dist: unsupported dtype %v", dt)) // construction refuses these
	}
	return b.Data()
}

// flatLen returns the number of elements of a buffer made by newFlat, or -1
// for anything else.
func flatLen(buf any) int {
	if b, ok := flat.Of(buf); ok {
		return b.Len()
	}
	return -1
}

// subFlat returns buf[lo:hi], sharing memory.
func subFlat(buf any, lo, hi int) any { return flat.Must(buf).Slice(lo, hi).Data() }

// copyFlat copies src into dst[off:] and reports how many elements it copied.
func copyFlat(dst any, off int, src any) int { return flat.Must(dst).CopyFrom(off, flat.Must(src)) }

// zeroFlat sets every element of buf to zero.
func zeroFlat(buf any) {
	if b, ok := flat.Of(buf); ok {
		b.Zero()
	}
}

// scaleFlat multiplies every element of a float buffer by s.
func scaleFlat(buf any, s float64) {
	if b, ok := flat.Of(buf); ok {
		b.Scale(s)
	}
}

// dense wraps a flat buffer as a tensor of the given shape (no copy).
// An empty shape gives a one-element vector, which is what comm moves for a
// scalar.
func dense(buf any, shape tensor.Shape) *tensor.Dense {
	if len(shape) == 0 {
		shape = tensor.Shape{1}
	}
	return tensor.New(tensor.WithShape(shape...), tensor.WithBacking(buf))
}

// flatOf returns the elements of v in row-major order as a typed slice,
// together with its dtype. The slice aliases v's memory when v is a
// contiguous tensor, so callers must only read it.
func flatOf(v G.Value) (any, tensor.Dtype, error) {
	switch t := v.(type) {
	case *tensor.Dense:
		if t.IsScalar() {
			buf := newFlat(t.Dtype(), 1)
			if err := setScalar(buf, t.ScalarValue()); err != nil {
				return nil, t.Dtype(), err
			}
			return buf, t.Dtype(), nil
		}
		if t.RequiresIterator() {
			t = t.Materialize().(*tensor.Dense)
		}
		n := t.Shape().TotalSize()
		data := t.Data()
		if flatLen(data) < n {
			return nil, t.Dtype(), fmt.Errorf("tensor of shape %v holds only %d elements", t.Shape(), flatLen(data))
		}
		return subFlat(data, 0, n), t.Dtype(), nil
	case G.Scalar:
		dt := v.Dtype()
		if !supported(dt) {
			return nil, dt, fmt.Errorf("scalar of dtype %v cannot take part in a collective", dt)
		}
		buf := newFlat(dt, 1)
		if err := setScalar(buf, v.Data()); err != nil {
			return nil, dt, err
		}
		return buf, dt, nil
	case nil:
		return nil, tensor.Dtype{}, fmt.Errorf("input has no value")
	}
	return nil, tensor.Dtype{}, fmt.Errorf("input is a %T; collectives take tensors and scalars", v)
}

// setScalar stores x (a Go number of buf's element type) into buf[0].
func setScalar(buf any, x any) error {
	if b, ok := flat.Of(buf); ok && b.SetFirst(x) {
		return nil
	}
	return fmt.Errorf("scalar %v (%T) does not fit a %T buffer", x, x, buf)
}

// result turns a flat buffer into the value a node of type typ and shape
// shape holds: a gorgonia scalar for scalar nodes, else a tensor.
func result(buf any, typ hm.Type, shape tensor.Shape) G.Value {
	if _, ok := typ.(tensor.Dtype); ok {
		switch b := buf.(type) {
		case []float32:
			return G.NewF32(b[0])
		case []float64:
			return G.NewF64(b[0])
		case []uint8:
			return G.NewU8(b[0])
		case []int32:
			return G.NewI32(b[0])
		case []int64:
			return G.NewI64(b[0])
		}
	}
	return tensor.New(tensor.WithShape(shape.Clone()...), tensor.WithBacking(buf))
}

// reuse returns prealloc's buffer when it is a tensor of dtype dt with n
// elements that the op may overwrite, else a fresh zeroed buffer.
func reuse(prealloc G.Value, dt tensor.Dtype, n int) any {
	if t, ok := prealloc.(*tensor.Dense); ok && t != nil && t.Dtype() == dt && !t.IsView() && !t.IsScalar() && t.Shape().TotalSize() == n {
		if data := t.Data(); flatLen(data) == n {
			return data
		}
	}
	return newFlat(dt, n)
}
