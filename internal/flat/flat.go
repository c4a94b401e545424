// Package flat handles the flat, contiguous buffers comm's collectives move
// ([]float32, []float64, []int8, []uint8, []int32, []int64) without a type
// switch at every use: Of turns such a slice, held as an any, into a Buf,
// whose methods are written once, generically, for every element type.
package flat

import (
	"fmt"

	"gorgonia.org/tensor"
)

// Number is every element type comm moves.
type Number interface {
	~float32 | ~float64 | ~int8 | ~uint8 | ~int32 | ~int64
}

// Buf is a flat buffer of one of the Number types.
type Buf interface {
	// Len is the number of elements.
	Len() int
	// Slice is the buffer's elements lo to hi, sharing memory.
	Slice(lo, hi int) Buf
	// CopyFrom copies src, which must have the same element type, into the
	// buffer from element off on, and reports how many elements it copied.
	CopyFrom(off int, src Buf) int
	// Zero sets every element to zero.
	Zero()
	// Scale multiplies every element by s; integer buffers are left alone.
	Scale(s float64)
	// SetFirst stores x, a Go number of the buffer's element type, as the
	// first element, and reports whether x had that type.
	SetFirst(x any) bool
	// Float64s returns the elements converted to float64 (a copy).
	Float64s() []float64
	// Data is the underlying slice.
	Data() any
}

// Of returns buf as a Buf, or false when it is not a slice of a Number type.
func Of(buf any) (Buf, bool) {
	switch b := buf.(type) {
	case []float32:
		return typed[float32](b), true
	case []float64:
		return typed[float64](b), true
	case []int8:
		return typed[int8](b), true
	case []uint8:
		return typed[uint8](b), true
	case []int32:
		return typed[int32](b), true
	case []int64:
		return typed[int64](b), true
	}
	return nil, false
}

// Must is Of for a buffer known to be one of the Number types; it panics,
// naming the type, for any other.
func Must(buf any) Buf {
	b, ok := Of(buf)
	if !ok {
		panic(fmt.Sprintf("flat: unsupported buffer %T", buf))
	}
	return b
}

// New returns a zeroed buffer of n elements of dtype dt, or false when comm
// does not move that dtype.
func New(dt tensor.Dtype, n int) (Buf, bool) {
	switch dt {
	case tensor.Float32:
		return make(typed[float32], n), true
	case tensor.Float64:
		return make(typed[float64], n), true
	case tensor.Int8:
		return make(typed[int8], n), true
	case tensor.Uint8:
		return make(typed[uint8], n), true
	case tensor.Int32:
		return make(typed[int32], n), true
	case tensor.Int64:
		return make(typed[int64], n), true
	}
	return nil, false
}

// Supported reports whether comm moves tensors of dtype dt.
func Supported(dt tensor.Dtype) bool {
	_, ok := New(dt, 0)
	return ok
}

type typed[T Number] []T

func (b typed[T]) Len() int             { return len(b) }
func (b typed[T]) Slice(lo, hi int) Buf { return b[lo:hi] }
func (b typed[T]) CopyFrom(off int, src Buf) int {
	return copy(b[off:], src.(typed[T]))
}
func (b typed[T]) Zero()     { clear(b) }
func (b typed[T]) Data() any { return []T(b) }

func (b typed[T]) Scale(s float64) {
	switch d := any([]T(b)).(type) {
	case []float32:
		f := float32(s)
		for i := range d {
			d[i] *= f
		}
	case []float64:
		for i := range d {
			d[i] *= s
		}
	}
}

func (b typed[T]) SetFirst(x any) bool {
	v, ok := x.(T)
	if ok {
		b[0] = v
	}
	return ok
}

func (b typed[T]) Float64s() []float64 {
	out := make([]float64, len(b))
	for i, v := range b {
		out[i] = float64(v)
	}
	return out
}
