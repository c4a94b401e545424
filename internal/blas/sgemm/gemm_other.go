//go:build !amd64 || purego

package sgemm

// Core is "": this build has no kernels.
func Core() string { return "" }

// Gemm reports false: this build has no kernels, and the caller computes
// every product itself.
func Gemm(transA, transB bool, m, n, k int, alpha float32, a []float32, lda int, b []float32, ldb int, beta float32, c []float32, ldc int) bool {
	return false
}

// GemmTiles reports false: this build has no kernels.
func GemmTiles(transA bool, m, n, k int, alpha float32, a []float32, lda int, b []float32, ldb int, beta float32, c []float32, ldc int) bool {
	return false
}

// Wide reports false: this build has no kernels.
func Wide() bool { return false }
