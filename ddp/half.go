package ddp

import (
	"gorgonia.org/tensor"

	"github.com/tandemml/tandem/comm"
)

// halfFormat is a 16-bit floating-point format as the compression hooks use
// it: its tensor dtype in the collectives and its conversions from and to
// float32 (comm's, rounding to nearest, ties to even, as PyTorch's CPU
// kernels round).
type halfFormat struct {
	name  string
	dtype tensor.Dtype
	from  func(float32) uint16
	to    func(uint16) float32
}

var (
	float16 = halfFormat{name: "float16", dtype: comm.Float16Dtype,
		from: func(f float32) uint16 { return uint16(comm.Float16From(f)) },
		to:   func(h uint16) float32 { return comm.Float16(h).Float32() }}
	bfloat16 = halfFormat{name: "bfloat16", dtype: comm.BFloat16Dtype,
		from: func(f float32) uint16 { return uint16(comm.BFloat16From(f)) },
		to:   func(h uint16) float32 { return comm.BFloat16(h).Float32() }}
)
