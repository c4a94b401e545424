//go:build !purego

package optim

import "github.com/tandemml/tandem/internal/cpufeat"

// The float32 update loops of SGD and Adam in AVX with fused multiply-adds,
// eight elements an instruction, where the processor has them: the same
// single-rounding arithmetic as the portable loops (and as PyTorch's
// vectorized kernels), at the speed of memory rather than of one scalar
// conversion after another.

//go:noescape
func sgdFMA32(p, g []float32, negLR, wd float32, hasWD bool)

//go:noescape
func momentumFMA32(p, g, buf []float32, mom, damp, negLR, wd float32, hasWD bool)

//go:noescape
func adamFMA32(p, g, m, v []float32, k *adamScalars32)

// haveFMA: the processor has the instructions of the kernels.
var haveFMA = cpufeat.FMA

// adam32 runs Adam's and AdamW's update (no maximize or AMSGrad; k.decay
// is 1 for Adam; k.l2 adds Adam's L2 weight decay k.wd·p to the gradient
// first) and reports whether it could.
func adam32(p, g, m, v []float32, k *adamScalars32) bool {
	if !haveFMA {
		return false
	}
	adamFMA32(p, g[:len(p)], m[:len(p)], v[:len(p)], k)
	return true
}

// sgdPlain32 runs SGD's update without momentum: d = g, or fma(wd, p, g)
// with weight decay; p = fma(negLR, d, p). It reports whether it could (the
// processor has FMA); len(g) must be at least len(p).
func sgdPlain32(p, g []float32, negLR, wd float32, hasWD bool) bool {
	if !haveFMA {
		return false
	}
	sgdFMA32(p, g[:len(p)], negLR, wd, hasWD)
	return true
}

// sgdMomentum32 runs SGD's update with momentum, past the first step and
// without Nesterov: d = g, or fma(wd, p, g) with weight decay;
// b = fma(damp, d, buf·mom); buf = b; p = fma(negLR, b, p). It reports
// whether it could.
func sgdMomentum32(p, g, buf []float32, mom, damp, negLR, wd float32, hasWD bool) bool {
	if !haveFMA {
		return false
	}
	momentumFMA32(p, g[:len(p)], buf[:len(p)], mom, damp, negLR, wd, hasWD)
	return true
}
