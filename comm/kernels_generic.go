//go:build !amd64

package comm

// Portable versions of the loops that amd64 runs in assembly
// (kernels_amd64.s). Each computes dst[i] = dst[i] op src[i] for i < len(dst).

func addF32(dst, src []float32) { addLoop(dst, src) }
func mulF32(dst, src []float32) { mulLoop(dst, src) }
func addF64(dst, src []float64) { addLoop(dst, src) }
func mulF64(dst, src []float64) { mulLoop(dst, src) }

func addLoop[T ~float32 | ~float64](dst, src []T) {
	src = src[:len(dst)]
	for i := range dst {
		dst[i] += src[i]
	}
}

func mulLoop[T ~float32 | ~float64](dst, src []T) {
	src = src[:len(dst)]
	for i := range dst {
		dst[i] *= src[i]
	}
}

// copyStream copies src to dst; amd64 writes around the caches.
func copyStream(dst, src []byte) { copy(dst, src) }

// addF32x3 adds a, b and c into dst, in that order.
func addF32x3(dst, a, b, c []float32) {
	addLoop(dst, a)
	addLoop(dst, b)
	addLoop(dst, c)
}
