package comm

// The reduction kernels: one switch on dtype and op per buffer, then a tight
// loop over typed slices.

type number interface {
	~float32 | ~float64 | ~int8 | ~uint8 | ~int32 | ~int64
}

type integer interface {
	~int8 | ~uint8 | ~int32 | ~int64
}

// reduceInto sets dst[i] = dst[i] op src[i]. Sum, Avg and PremulSum add (their
// scaling happens before or after). len(dst) == len(src).
func reduceInto(dst, src []byte, dt dtype, k ReduceKind) {
	switch dt {
	case dtFloat32:
		d, s := typed[float32](dst), typed[float32](src)
		switch k {
		case KindSum, KindAvg, KindPremulSum:
			addF32(d, s[:len(d)])
		case KindProduct:
			mulF32(d, s[:len(d)])
		default:
			reduceFloat(d, s, k)
		}
	case dtFloat64:
		d, s := typed[float64](dst), typed[float64](src)
		switch k {
		case KindSum, KindAvg, KindPremulSum:
			addF64(d, s[:len(d)])
		case KindProduct:
			mulF64(d, s[:len(d)])
		default:
			reduceFloat(d, s, k)
		}
	case dtInt8:
		reduceInt(typed[int8](dst), typed[int8](src), k)
	case dtUint8:
		reduceInt(typed[uint8](dst), typed[uint8](src), k)
	case dtInt32:
		reduceInt(typed[int32](dst), typed[int32](src), k)
	case dtInt64:
		reduceInt(typed[int64](dst), typed[int64](src), k)
	default:
		// 16-bit floats never reach here: halfreduce.go widens them
		panic("comm: reduceInto on dtype " + dt.String())
	}
}

// reduceFrom reduces every src into dst in turn, as reduceInto on each
// would; float32 sums take three sources a pass (addF32x3), which reads
// and writes dst a third as often.
func reduceFrom(dst []byte, srcs [][]byte, dt dtype, k ReduceKind) {
	if dt == dtFloat32 && (k == KindSum || k == KindAvg || k == KindPremulSum) {
		d := typed[float32](dst)
		for len(srcs) >= 3 {
			addF32x3(d, typed[float32](srcs[0]), typed[float32](srcs[1]), typed[float32](srcs[2]))
			srcs = srcs[3:]
		}
	}
	for _, src := range srcs {
		reduceInto(dst, src, dt, k)
	}
}

func reduceFloat[T ~float32 | ~float64](dst, src []T, k ReduceKind) {
	if !reduceArith(dst, src, k) {
		panic("comm: reduce kind " + k.String() + " on a float buffer")
	}
}

func reduceInt[T integer](dst, src []T, k ReduceKind) {
	if reduceArith(dst, src, k) {
		return
	}
	src = src[:len(dst)]
	switch k {
	case KindBAnd:
		for i := range dst {
			dst[i] &= src[i]
		}
	case KindBOr:
		for i := range dst {
			dst[i] |= src[i]
		}
	case KindBXor:
		for i := range dst {
			dst[i] ^= src[i]
		}
	default:
		panic("comm: reduce kind " + k.String() + " on an integer buffer")
	}
}

// reduceArith applies the reductions that every dtype has (sum and its
// relatives, product, min, max) and reports whether k was one of them.
func reduceArith[T ~float32 | ~float64 | integer](dst, src []T, k ReduceKind) bool {
	src = src[:len(dst)]
	switch k {
	case KindSum, KindAvg, KindPremulSum:
		for i := range dst {
			dst[i] += src[i]
		}
	case KindProduct:
		for i := range dst {
			dst[i] *= src[i]
		}
	case KindMin:
		for i := range dst {
			dst[i] = min(dst[i], src[i])
		}
	case KindMax:
		for i := range dst {
			dst[i] = max(dst[i], src[i])
		}
	default:
		return false
	}
	return true
}

// scaleBuf multiplies every element by f (PremulSum's factor; integer
// buffers take f as a whole number, wrapping on overflow).
func scaleBuf(b []byte, dt dtype, f float64) {
	switch dt {
	case dtFloat32:
		mulAll(typed[float32](b), float32(f))
	case dtFloat64:
		mulAll(typed[float64](b), f)
	case dtInt8:
		mulAll(typed[int8](b), int8(int64(f)))
	case dtUint8:
		mulAll(typed[uint8](b), uint8(int64(f)))
	case dtInt32:
		mulAll(typed[int32](b), int32(int64(f)))
	case dtInt64:
		mulAll(typed[int64](b), int64(f))
	}
}

func mulAll[T number](s []T, f T) {
	for i := range s {
		s[i] *= f
	}
}

// divideBuf divides every element by n (Avg). Integer division truncates
// toward zero.
func divideBuf(b []byte, dt dtype, n int) {
	switch dt {
	case dtFloat32:
		divAll(typed[float32](b), float32(n))
	case dtFloat64:
		divAll(typed[float64](b), float64(n))
	case dtInt8:
		divInt(typed[int8](b), int64(n))
	case dtUint8:
		divInt(typed[uint8](b), int64(n))
	case dtInt32:
		divInt(typed[int32](b), int64(n))
	case dtInt64:
		divInt(typed[int64](b), int64(n))
	}
}

func divAll[T ~float32 | ~float64](s []T, n T) {
	for i := range s {
		s[i] /= n
	}
}

// divInt divides in int64 so that a world size beyond the element type's
// range still divides correctly.
func divInt[T integer](s []T, n int64) {
	for i := range s {
		s[i] = T(int64(s[i]) / n)
	}
}
