package devstage

import (
	"unsafe"

	"gorgonia.org/tensor"
)

// elemSize is the size in bytes of one element of dt, and whether the Stager
// handles dt.
func elemSize(dt tensor.Dtype) (int, bool) {
	switch dt {
	case tensor.Float32, tensor.Int32:
		return 4, true
	case tensor.Float64, tensor.Int64:
		return 8, true
	case tensor.Int8, tensor.Uint8:
		return 1, true
	}
	return 0, false
}

// view returns a one-dimensional tensor of dt over b, without copying: the
// collective reads and writes b itself. b is not empty.
func view(b []byte, dt tensor.Dtype) *tensor.Dense {
	switch dt {
	case tensor.Float32:
		return wrap[float32](b)
	case tensor.Float64:
		return wrap[float64](b)
	case tensor.Int32:
		return wrap[int32](b)
	case tensor.Int64:
		return wrap[int64](b)
	case tensor.Int8:
		return wrap[int8](b)
	case tensor.Uint8:
		return wrap[uint8](b)
	}
	panic("devstage: view of an unchecked dtype " + dt.String())
}

func wrap[T float32 | float64 | int32 | int64 | int8 | uint8](b []byte) *tensor.Dense {
	var z T
	s := unsafe.Slice((*T)(unsafe.Pointer(&b[0])), len(b)/int(unsafe.Sizeof(z)))
	return tensor.New(tensor.WithShape(len(s)), tensor.WithBacking(s))
}
