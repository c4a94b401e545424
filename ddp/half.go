package ddp

import (
	"unsafe"

	"gorgonia.org/tensor"

	"github.com/tandemml/tandem/comm"
)

// halfFormat is a 16-bit floating-point format as the compression hooks use
// it: its tensor dtype in the collectives and its conversions from and to
// float32 (comm's, rounding to nearest, ties to even, as PyTorch's CPU
// kernels round; the slice forms are vectorised where comm has kernels).
type halfFormat struct {
	name   string
	dtype  tensor.Dtype
	from   func(float32) uint16
	to     func(uint16) float32
	narrow func(dst []uint16, src []float32)
	widen  func(dst []float32, src []uint16)
}

var (
	float16 = halfFormat{name: "float16", dtype: comm.Float16Dtype,
		from:   func(f float32) uint16 { return uint16(comm.Float16From(f)) },
		to:     func(h uint16) float32 { return comm.Float16(h).Float32() },
		narrow: func(dst []uint16, src []float32) { comm.ToFloat16(as16[comm.Float16](dst), src) },
		widen:  func(dst []float32, src []uint16) { comm.FromFloat16(dst, as16[comm.Float16](src)) }}
	bfloat16 = halfFormat{name: "bfloat16", dtype: comm.BFloat16Dtype,
		from:   func(f float32) uint16 { return uint16(comm.BFloat16From(f)) },
		to:     func(h uint16) float32 { return comm.BFloat16(h).Float32() },
		narrow: func(dst []uint16, src []float32) { comm.ToBFloat16(as16[comm.BFloat16](dst), src) },
		widen:  func(dst []float32, src []uint16) { comm.FromBFloat16(dst, as16[comm.BFloat16](src)) }}
)

// as16 views bits as a slice of a 16-bit float type.
func as16[T comm.Float16 | comm.BFloat16](s []uint16) []T {
	return unsafe.Slice((*T)(unsafe.Pointer(unsafe.SliceData(s))), len(s))
}

// tensor returns a 1-D tensor of the format's dtype backed by h.
func (f halfFormat) tensor(h []uint16) *tensor.Dense {
	if f.dtype == comm.Float16Dtype {
		return tensor.New(tensor.WithShape(len(h)), tensor.WithBacking(as16[comm.Float16](h)))
	}
	return tensor.New(tensor.WithShape(len(h)), tensor.WithBacking(as16[comm.BFloat16](h)))
}
