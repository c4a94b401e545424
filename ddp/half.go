package ddp

import "math"

// halfFormat is a 16-bit floating-point format: conversions from and to
// float32, rounding to nearest, ties to even, as PyTorch's CPU kernels
// round. Arithmetic on half values is done in float32 and rounded back, as
// PyTorch's CPU kernels for half tensors do.
type halfFormat struct {
	name string
	from func(float32) uint16
	to   func(uint16) float32
}

var (
	float16  = halfFormat{name: "float16", from: f32ToF16, to: f16ToF32}
	bfloat16 = halfFormat{name: "bfloat16", from: f32ToBF16, to: bf16ToF32}
)

// f32ToF16 converts to IEEE binary16, rounding to nearest even; values too
// large become infinities, NaNs stay NaNs.
func f32ToF16(f float32) uint16 {
	b := math.Float32bits(f)
	sign := uint16(b>>16) & 0x8000
	exp := int(b>>23) & 0xff
	mant := b & 0x7fffff
	if exp == 0xff {
		if mant != 0 {
			return sign | 0x7e00 | uint16(mant>>13)
		}
		return sign | 0x7c00
	}
	e := exp - 127 + 15
	if e >= 0x1f {
		return sign | 0x7c00
	}
	if e <= 0 {
		// subnormal half: the value is m * 2^-24 with m = M >> shift
		shift := uint(126 - exp)
		if shift > 24 {
			return sign
		}
		m := (mant | 0x800000) >> shift
		rem := (mant | 0x800000) & (1<<shift - 1)
		half := uint32(1) << (shift - 1)
		if rem > half || rem == half && m&1 == 1 {
			m++
		}
		return sign | uint16(m)
	}
	h := uint32(e)<<10 | mant>>13
	rem := mant & 0x1fff
	if rem > 0x1000 || rem == 0x1000 && h&1 == 1 {
		h++ // may carry into the exponent, up to infinity
	}
	return sign | uint16(h)
}

// f16ToF32 converts an IEEE binary16 value to float32 (exactly).
func f16ToF32(h uint16) float32 {
	sign := uint32(h&0x8000) << 16
	exp := uint32(h>>10) & 0x1f
	mant := uint32(h & 0x3ff)
	switch exp {
	case 0:
		v := float32(mant) * (1.0 / (1 << 24))
		if sign != 0 {
			v = -v
		}
		return v
	case 0x1f:
		return math.Float32frombits(sign | 0x7f800000 | mant<<13)
	}
	return math.Float32frombits(sign | (exp-15+127)<<23 | mant<<13)
}

// f32ToBF16 converts to bfloat16 (the high half of a float32), rounding to
// nearest even.
func f32ToBF16(f float32) uint16 {
	b := math.Float32bits(f)
	if b&0x7fffffff > 0x7f800000 {
		return uint16(b>>16) | 0x40 // quiet NaN
	}
	return uint16((b + 0x7fff + (b>>16)&1) >> 16)
}

// bf16ToF32 converts bfloat16 to float32 (exactly).
func bf16ToF32(h uint16) float32 { return math.Float32frombits(uint32(h) << 16) }

// add returns a+b rounded to the format.
func (f halfFormat) add(a, b uint16) uint16 { return f.from(f.to(a) + f.to(b)) }
