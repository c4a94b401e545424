package comm

import (
	"unsafe"

	"github.com/tandemml/tandem/internal/cpufeat"
)

// Vector loops in kernels_amd64.s. Each computes dst[i] = dst[i] op src[i]
// for i < len(dst); src must be at least as long as dst.

//go:noescape
func addF32SSE(dst, src []float32)

//go:noescape
func addF32AVX(dst, src []float32)

//go:noescape
func addF64AVX(dst, src []float64)

//go:noescape
func mulF32(dst, src []float32)

//go:noescape
func addF64SSE(dst, src []float64)

// haveAVX: the processor and the operating system run 256-bit vectors
// (cpufeat.FMA implies AVX).
var haveAVX = cpufeat.FMA

// addF32 and addF64 add in 256-bit vectors where the processor has them,
// else in SSE2's 128-bit ones: the same IEEE additions, element by
// element, either way. On the development machine (one core, 2026-11-25)
// the 256-bit loop adds 128 KiB buffers at 41.5 GB/s against 33.5, and
// 4 MiB ones, out of the level-2 cache, at 24.6-25.0 against 26.1; a
// staged all-reduce of four ranks takes the same time with either.
func addF32(dst, src []float32) {
	if haveAVX {
		addF32AVX(dst, src)
		return
	}
	addF32SSE(dst, src)
}

func addF64(dst, src []float64) {
	if haveAVX {
		addF64AVX(dst, src)
		return
	}
	addF64SSE(dst, src)
}

//go:noescape
func mulF64(dst, src []float64)

// copyStreamAligned copies len(dst) bytes (a multiple of 64; dst 16-byte
// aligned) from src with non-temporal stores (see copyStream).
//
//go:noescape
func copyStreamAligned(dst, src []byte)

// copyStream copies src to dst (len(dst) >= len(src)) with stores that
// write around the caches: for memory that is not read again soon, it
// saves reading each destination line before writing it.
func copyStream(dst, src []byte) {
	n := len(src)
	if n < 4096 {
		copy(dst, src)
		return
	}
	head := int(-uintptr(unsafe.Pointer(&dst[0])) & 15)
	copy(dst[:head], src[:head])
	body := (n - head) &^ 63
	copyStreamAligned(dst[head:head+body], src[head:head+body])
	copy(dst[head+body:n], src[head+body:n])
}

//go:noescape
func addF32x3AVX(dst, a, b, c []float32)

// addF32x3 adds a, b and c into dst, in that order, element by element:
// what three calls of addF32 give, in one pass over dst.
func addF32x3(dst, a, b, c []float32) {
	if haveAVX {
		addF32x3AVX(dst, a[:len(dst)], b[:len(dst)], c[:len(dst)])
		return
	}
	addF32SSE(dst, a)
	addF32SSE(dst, b)
	addF32SSE(dst, c)
}
