package comm

import "unsafe"

// Vector loops in kernels_amd64.s. Each computes dst[i] = dst[i] op src[i]
// for i < len(dst); src must be at least as long as dst.

//go:noescape
func addF32(dst, src []float32)

//go:noescape
func mulF32(dst, src []float32)

//go:noescape
func addF64(dst, src []float64)

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
