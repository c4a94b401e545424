//go:build !purego

package comm

import "github.com/tandemml/tandem/internal/cpufeat"

// The 16-bit kernels in kernels_half_amd64.s, eight elements at a time; each
// stops at len(dst) rounded down to a multiple of 8, and src must be at
// least as long. They give the bits the portable loops give (NaNs
// included: VCVTPS2PH keeps the sign and top payload bits and sets the quiet
// bit, as Float16From does; VCVTPH2PS quiets a NaN, as Float16.Float32 does).

//go:noescape
func cvtPH2PS(dst []float32, src []uint16)

//go:noescape
func cvtPS2PH(dst []uint16, src []float32)

//go:noescape
func addPH(dst []float32, src []uint16)

//go:noescape
func cvtBF2PS(dst []float32, src []uint16)

//go:noescape
func cvtPS2BF(dst []uint16, src []float32)

//go:noescape
func addBF(dst []float32, src []uint16)

// useF16C is fixed at start-up; tests flip it to compare the two paths.
var useF16C = cpufeat.AVX2F16C

// vec16 runs the vector kernel k on the whole multiple-of-8 prefix and
// returns the tails left to the portable loop.
func vec16[D, S any](dst []D, src []S, k func([]D, []S)) ([]D, []S) {
	if !useF16C || len(dst) < 8 {
		return dst, src
	}
	k(dst, src)
	done := len(dst) &^ 7
	return dst[done:], src[done:]
}

func widenF16(dst []float32, src []uint16) {
	dst, src = vec16(dst, src, cvtPH2PS)
	widenF16Go(dst, src)
}

func narrowF16(dst []uint16, src []float32) {
	dst, src = vec16(dst, src, cvtPS2PH)
	narrowF16Go(dst, src)
}

func addWidenF16(dst []float32, src []uint16) {
	dst, src = vec16(dst, src, addPH)
	addWidenF16Go(dst, src)
}

func widenBF16(dst []float32, src []uint16) {
	dst, src = vec16(dst, src, cvtBF2PS)
	widenBF16Go(dst, src)
}

func narrowBF16(dst []uint16, src []float32) {
	dst, src = vec16(dst, src, cvtPS2BF)
	narrowBF16Go(dst, src)
}

func addWidenBF16(dst []float32, src []uint16) {
	dst, src = vec16(dst, src, addBF)
	addWidenBF16Go(dst, src)
}
