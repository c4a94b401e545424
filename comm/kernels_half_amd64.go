//go:build !purego

package comm

import "github.com/tandemml/tandem/internal/cpufeat"

// F16C conversions in kernels_half_amd64.s, eight elements at a time; both
// stop at len(dst) rounded down to a multiple of 8, and src must be at least
// as long. VCVTPS2PH runs with rounding mode 0 (to nearest, ties to even)
// and gives the bits Float16From gives, NaNs included; VCVTPH2PS is exact.

//go:noescape
func cvtPH2PS(dst []float32, src []uint16)

//go:noescape
func cvtPS2PH(dst []uint16, src []float32)

// useF16C is fixed at start-up; tests flip it to compare the two paths.
var useF16C = cpufeat.F16C

func widenF16(dst []float32, src []uint16) {
	if useF16C && len(dst) >= 8 {
		cvtPH2PS(dst, src)
		done := len(dst) &^ 7
		dst, src = dst[done:], src[done:]
	}
	widenF16Go(dst, src)
}

func narrowF16(dst []uint16, src []float32) {
	if useF16C && len(dst) >= 8 {
		cvtPS2PH(dst, src)
		done := len(dst) &^ 7
		dst, src = dst[done:], src[done:]
	}
	narrowF16Go(dst, src)
}
