//go:build !amd64 || purego

package optim

// Without the AVX kernels the portable loops run.

func sgdPlain32(p, g []float32, negLR, wd float32, hasWD bool) bool { return false }

func adam32(p, g, m, v []float32, k *adamScalars32) bool { return false }

func sgdMomentum32(p, g, buf []float32, mom, damp, negLR, wd float32, hasWD bool) bool {
	return false
}
