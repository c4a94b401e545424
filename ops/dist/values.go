package dist

import (
	"fmt"

	"github.com/chewxy/hm"
	G "gorgonia.org/gorgonia"
	"gorgonia.org/tensor"
)

// This file holds the plumbing between gorgonia values and the flat,
// contiguous buffers that comm's collectives move.

// number is every element type comm can move.
type number interface {
	~float32 | ~float64 | ~int8 | ~uint8 | ~int32 | ~int64
}

// supported reports whether comm can move tensors of dtype dt.
func supported(dt tensor.Dtype) bool {
	switch dt {
	case tensor.Float32, tensor.Float64, tensor.Int8, tensor.Uint8, tensor.Int32, tensor.Int64:
		return true
	}
	return false
}

// isFloat reports whether dt has gradients.
func isFloat(dt tensor.Dtype) bool { return dt == tensor.Float32 || dt == tensor.Float64 }

// newFlat returns a zeroed buffer of n elements of dtype dt.
func newFlat(dt tensor.Dtype, n int) any {
	switch dt {
	case tensor.Float32:
		return make([]float32, n)
	case tensor.Float64:
		return make([]float64, n)
	case tensor.Int8:
		return make([]int8, n)
	case tensor.Uint8:
		return make([]uint8, n)
	case tensor.Int32:
		return make([]int32, n)
	case tensor.Int64:
		return make([]int64, n)
	}
	panic(fmt.Sprintf("dist: unsupported dtype %v", dt)) // construction refuses these
}

// flatLen returns the number of elements of a buffer made by newFlat.
func flatLen(buf any) int {
	switch b := buf.(type) {
	case []float32:
		return len(b)
	case []float64:
		return len(b)
	case []int8:
		return len(b)
	case []uint8:
		return len(b)
	case []int32:
		return len(b)
	case []int64:
		return len(b)
	}
	return -1
}

// subFlat returns buf[lo:hi], sharing memory.
func subFlat(buf any, lo, hi int) any {
	switch b := buf.(type) {
	case []float32:
		return b[lo:hi]
	case []float64:
		return b[lo:hi]
	case []int8:
		return b[lo:hi]
	case []uint8:
		return b[lo:hi]
	case []int32:
		return b[lo:hi]
	case []int64:
		return b[lo:hi]
	}
	panic(fmt.Sprintf("dist: unsupported buffer %T", buf))
}

// copyFlat copies src into dst[off:] and reports how many elements it copied.
func copyFlat(dst any, off int, src any) int {
	switch d := dst.(type) {
	case []float32:
		return copy(d[off:], src.([]float32))
	case []float64:
		return copy(d[off:], src.([]float64))
	case []int8:
		return copy(d[off:], src.([]int8))
	case []uint8:
		return copy(d[off:], src.([]uint8))
	case []int32:
		return copy(d[off:], src.([]int32))
	case []int64:
		return copy(d[off:], src.([]int64))
	}
	panic(fmt.Sprintf("dist: unsupported buffer %T", dst))
}

// zeroFlat sets every element of buf to zero.
func zeroFlat(buf any) {
	switch b := buf.(type) {
	case []float32:
		clear(b)
	case []float64:
		clear(b)
	case []int8:
		clear(b)
	case []uint8:
		clear(b)
	case []int32:
		clear(b)
	case []int64:
		clear(b)
	}
}

// scaleFlat multiplies every element of a float buffer by s.
func scaleFlat(buf any, s float64) {
	switch b := buf.(type) {
	case []float32:
		f := float32(s)
		for i := range b {
			b[i] *= f
		}
	case []float64:
		for i := range b {
			b[i] *= s
		}
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
	switch b := buf.(type) {
	case []float32:
		if v, ok := x.(float32); ok {
			b[0] = v
			return nil
		}
	case []float64:
		if v, ok := x.(float64); ok {
			b[0] = v
			return nil
		}
	case []int8:
		if v, ok := x.(int8); ok {
			b[0] = v
			return nil
		}
	case []uint8:
		if v, ok := x.(uint8); ok {
			b[0] = v
			return nil
		}
	case []int32:
		if v, ok := x.(int32); ok {
			b[0] = v
			return nil
		}
	case []int64:
		if v, ok := x.(int64); ok {
			b[0] = v
			return nil
		}
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
