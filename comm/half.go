package comm

import (
	"math"
	"reflect"

	"gorgonia.org/tensor"
)

// Float16 is an IEEE 754 binary16 value held as its bits: 1 sign bit, 5
// exponent bits, 10 significand bits (about 3.3 decimal digits, finite
// values up to 65504, subnormals down to 2^-24).
//
// gorgonia's tensor package has no 16-bit float dtype, but a Dense tensor
// holds any Go element type: a float16 tensor is a *tensor.Dense whose
// backing is a []Float16, and its Dtype() is Float16Dtype:
//
//	h := tensor.New(tensor.WithShape(n), tensor.WithBacking(make([]comm.Float16, n)))
//	comm.ToFloat16(h.Data().([]comm.Float16), grads.Float32s())
//
// Collectives move such tensors as they are (2 bytes an element) and reduce
// them in float32 with one final rounding (see ReduceOp). gorgonia's own
// arithmetic does not know the type: widen to float32 (FromFloat16) to
// compute.
type Float16 uint16

// BFloat16 is a bfloat16 value held as its bits: the upper half of a
// float32 (1 sign bit, 8 exponent bits, 7 significand bits), float32's range
// with about 2.4 decimal digits. A bfloat16 tensor is a *tensor.Dense backed
// by a []BFloat16 (Dtype() == BFloat16Dtype); see Float16.
type BFloat16 uint16

// Float16Dtype and BFloat16Dtype are the tensor dtypes of tensors backed by
// []Float16 and []BFloat16. Pass them to tensor.Of to allocate one:
// tensor.New(tensor.Of(comm.Float16Dtype), tensor.WithShape(n)).
var (
	Float16Dtype  = tensor.Dtype{Type: reflect.TypeFor[Float16]()}
	BFloat16Dtype = tensor.Dtype{Type: reflect.TypeFor[BFloat16]()}
)

// gorgonia's tensor.Of registers its dtype in a package-level list on every
// call, unsynchronised; registering the 16-bit dtypes here, before any
// goroutine can call it, leaves later calls reading only.
func init() {
	tensor.Register(Float16Dtype)
	tensor.Register(BFloat16Dtype)
}

// Float16From rounds f to the nearest float16, ties to even (IEEE 754's
// default, what PyTorch's .half() and the F16C instructions do). Values
// beyond the largest finite float16 (65504) by at least half a unit in the
// last place become infinities; values smaller than half the smallest
// subnormal (2^-25) become zeros of f's sign; NaNs stay NaN (quiet, sign and
// the top 9 payload bits kept).
func Float16From(f float32) Float16 {
	b := math.Float32bits(f)
	sign := uint16(b>>16) & 0x8000
	exp := int(b>>23) & 0xff
	mant := b & 0x7fffff
	if exp == 0xff {
		if mant != 0 {
			return Float16(sign | 0x7e00 | uint16(mant>>13))
		}
		return Float16(sign | 0x7c00)
	}
	e := exp - 127 + 15
	if e >= 0x1f {
		return Float16(sign | 0x7c00)
	}
	if e <= 0 {
		// a subnormal float16, m * 2^-24: the significand (with its
		// implicit bit) shifted right, rounded to nearest even
		shift := uint(126 - exp)
		if shift > 24 {
			return Float16(sign)
		}
		full := mant | 0x800000
		m := full >> shift
		rem := full & (1<<shift - 1)
		halfway := uint32(1) << (shift - 1)
		if rem > halfway || rem == halfway && m&1 == 1 {
			m++ // may become the smallest normal, which is right
		}
		return Float16(sign | uint16(m))
	}
	h := uint32(e)<<10 | mant>>13
	rem := mant & 0x1fff
	if rem > 0x1000 || rem == 0x1000 && h&1 == 1 {
		h++ // may carry into the exponent, up to infinity
	}
	return Float16(sign | uint16(h))
}

// Float32 returns h as a float32, exactly (every float16 is a float32);
// a NaN comes back quiet, with its sign and payload (as F16C's VCVTPH2PS
// gives it).
func (h Float16) Float32() float32 {
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
		if mant != 0 {
			mant |= 0x200
		}
		return math.Float32frombits(sign | 0x7f800000 | mant<<13)
	}
	return math.Float32frombits(sign | (exp-15+127)<<23 | mant<<13)
}

// BFloat16From rounds f to the nearest bfloat16, ties to even. Values
// beyond the largest finite bfloat16 by at least half a unit in the last
// place become infinities; NaNs stay NaN (quiet, sign and the top 6 payload
// bits kept). Subnormals round like any other value.
func BFloat16From(f float32) BFloat16 {
	b := math.Float32bits(f)
	if b&0x7fffffff > 0x7f800000 {
		return BFloat16(uint16(b>>16) | 0x40)
	}
	return BFloat16((b + 0x7fff + (b>>16)&1) >> 16)
}

// Float32 returns h as a float32, exactly.
func (h BFloat16) Float32() float32 { return math.Float32frombits(uint32(h) << 16) }

// ToFloat16 rounds src into dst, element by element (Float16From), for
// i < min(len(dst), len(src)), and returns how many it wrote.
func ToFloat16(dst []Float16, src []float32) int {
	n := min(len(dst), len(src))
	narrowF16(typed[uint16](asBytes(dst[:n])), src[:n])
	return n
}

// FromFloat16 widens src into dst exactly, for i < min(len(dst),
// len(src)), and returns how many it wrote.
func FromFloat16(dst []float32, src []Float16) int {
	n := min(len(dst), len(src))
	widenF16(dst[:n], typed[uint16](asBytes(src[:n])))
	return n
}

// ToBFloat16 rounds src into dst (BFloat16From), for i < min(len(dst),
// len(src)), and returns how many it wrote.
func ToBFloat16(dst []BFloat16, src []float32) int {
	n := min(len(dst), len(src))
	narrowBF16(typed[uint16](asBytes(dst[:n])), src[:n])
	return n
}

// FromBFloat16 widens src into dst exactly, for i < min(len(dst),
// len(src)), and returns how many it wrote.
func FromBFloat16(dst []float32, src []BFloat16) int {
	n := min(len(dst), len(src))
	widenBF16(dst[:n], typed[uint16](asBytes(src[:n])))
	return n
}

// The portable loops; the amd64 build runs AVX2 and F16C kernels where the
// processor has them (kernels_half_amd64.go), which give the same bits.

func narrowF16Go(dst []uint16, src []float32) {
	src = src[:len(dst)]
	for i, v := range src {
		dst[i] = uint16(Float16From(v))
	}
}

func widenF16Go(dst []float32, src []uint16) {
	src = src[:len(dst)]
	for i, v := range src {
		dst[i] = Float16(v).Float32()
	}
}

func addWidenF16Go(dst []float32, src []uint16) {
	src = src[:len(dst)]
	for i, v := range src {
		dst[i] += Float16(v).Float32()
	}
}

func narrowBF16Go(dst []uint16, src []float32) {
	src = src[:len(dst)]
	for i, v := range src {
		dst[i] = uint16(BFloat16From(v))
	}
}

func widenBF16Go(dst []float32, src []uint16) {
	src = src[:len(dst)]
	for i, v := range src {
		dst[i] = math.Float32frombits(uint32(v) << 16)
	}
}

func addWidenBF16Go(dst []float32, src []uint16) {
	src = src[:len(dst)]
	for i, v := range src {
		dst[i] += math.Float32frombits(uint32(v) << 16)
	}
}

// widenHalf and narrowHalf convert between a 16-bit buffer of dtype dt and
// float32.
func widenHalf(dst []float32, src []byte, dt dtype) {
	if dt == dtFloat16 {
		widenF16(dst, typed[uint16](src))
	} else {
		widenBF16(dst, typed[uint16](src))
	}
}

func narrowHalf(dst []byte, src []float32, dt dtype) {
	if dt == dtFloat16 {
		narrowF16(typed[uint16](dst), src)
	} else {
		narrowBF16(typed[uint16](dst), src)
	}
}

// addWidenHalf sets dst[i] += widen(src[i]).
func addWidenHalf(dst []float32, src []byte, dt dtype) {
	if dt == dtFloat16 {
		addWidenF16(dst, typed[uint16](src))
	} else {
		addWidenBF16(dst, typed[uint16](src))
	}
}
