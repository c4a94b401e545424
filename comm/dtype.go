package comm

import (
	"fmt"
	"unsafe"

	"gorgonia.org/tensor"
)

// dtype is the element type of a buffer as the algorithms see it: a small
// enum, switched on once per buffer before a typed loop.
type dtype uint8

const (
	dtInvalid dtype = iota
	dtFloat32
	dtFloat64
	dtInt8
	dtUint8
	dtInt32
	dtInt64
	dtFloat16  // Float16Dtype: reduced in float32, rounded once (halfreduce.go)
	dtBFloat16 // BFloat16Dtype: likewise
)

var dtypeNames = [...]string{"invalid", "float32", "float64", "int8", "uint8", "int32", "int64", "float16", "bfloat16"}
var dtypeSizes = [...]int{0, 4, 8, 1, 1, 4, 8, 2, 2}

func (d dtype) String() string { return dtypeNames[d] }
func (d dtype) size() int      { return dtypeSizes[d] }
func (d dtype) isFloat() bool  { return d == dtFloat32 || d == dtFloat64 || d.isHalf() }
func (d dtype) isHalf() bool   { return d == dtFloat16 || d == dtBFloat16 }

func dtypeOf(t tensor.Dtype) dtype {
	switch t {
	case tensor.Float32:
		return dtFloat32
	case tensor.Float64:
		return dtFloat64
	case tensor.Int8:
		return dtInt8
	case tensor.Uint8:
		return dtUint8
	case tensor.Int32:
		return dtInt32
	case tensor.Int64:
		return dtInt64
	case Float16Dtype:
		return dtFloat16
	case BFloat16Dtype:
		return dtBFloat16
	}
	return dtInvalid
}

// buffer is a tensor's memory as the algorithms use it: raw bytes aliasing the
// tensor (no copy), its element type and shape.
type buffer struct {
	b     []byte
	dt    dtype
	shape []int
}

func (b buffer) elems() int { return len(b.b) / b.dt.size() }

// tensorBuffer returns t's memory as bytes, or an error wrapping
// ErrInvalidArgument saying why t cannot take part in a collective.
func tensorBuffer(t *tensor.Dense, what string) (buffer, error) {
	if t == nil {
		return buffer{}, errorf(ErrInvalidArgument, "%s is a nil tensor", what)
	}
	dt := dtypeOf(t.Dtype())
	if dt == dtInvalid {
		return buffer{}, errorf(ErrInvalidArgument, "%s has dtype %v; collectives support float32, float64, int8, uint8, int32, int64, and float16 and bfloat16 (comm.Float16Dtype, comm.BFloat16Dtype)", what, t.Dtype())
	}
	n := t.Shape().TotalSize()
	if t.IsScalar() {
		n = 1
	}
	if n > 0 && t.RequiresIterator() {
		return buffer{}, errorf(ErrInvalidArgument, "%s is a strided view or masked; call Materialize (or Clone) to get a contiguous tensor", what)
	}
	raw := t.Raw
	if len(raw) < n*dt.size() {
		return buffer{}, errorf(ErrInvalidArgument, "%s holds %d bytes but its shape %v needs %d", what, len(raw), t.Shape(), n*dt.size())
	}
	return buffer{b: raw[:n*dt.size()], dt: dt, shape: append([]int(nil), t.Shape()...)}, nil
}

// shapeString formats a shape as fingerprints show it: [2,3], [] for a scalar.
func shapeString(s []int) string {
	out := make([]byte, 0, 2+4*len(s))
	out = append(out, '[')
	for i, d := range s {
		if i > 0 {
			out = append(out, ',')
		}
		out = fmt.Appendf(out, "%d", d)
	}
	return string(append(out, ']'))
}

func sameShape(a, b []int) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// typed reinterprets b as a slice of T without copying.
func typed[T any](b []byte) []T {
	if len(b) == 0 {
		return nil
	}
	var z T
	return unsafe.Slice((*T)(unsafe.Pointer(&b[0])), len(b)/int(unsafe.Sizeof(z)))
}

// asBytes reinterprets a typed slice as bytes without copying.
func asBytes[T any](s []T) []byte {
	if len(s) == 0 {
		return nil
	}
	var z T
	return unsafe.Slice((*byte)(unsafe.Pointer(&s[0])), len(s)*int(unsafe.Sizeof(z)))
}
