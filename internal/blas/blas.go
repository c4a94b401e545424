package blas

import (
	gblas "gonum.org/v1/gonum/blas"
	"gonum.org/v1/gonum/blas/gonum"
)

// Implementation is the full gonum BLAS interface that gorgonia and its
// tensor package accept; Default returns the one this binary uses.
type Implementation interface {
	gblas.Float32
	gblas.Float64
	gblas.Complex64
	gblas.Complex128
}

// pure is gonum's Go implementation, used for every routine that the
// optional C path does not override.
type pure = gonum.Implementation

// Sgemm computes C = alpha·op(A)·op(B) + beta·C for row-major float32
// matrices, op transposing when the flag says so (gonum's argument order).
func Sgemm(tA, tB gblas.Transpose, m, n, k int, alpha float32, a []float32, lda int, b []float32, ldb int, beta float32, c []float32, ldc int) {
	Default().Sgemm(tA, tB, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc)
}

// Dgemm is Sgemm for float64.
func Dgemm(tA, tB gblas.Transpose, m, n, k int, alpha float64, a []float64, lda int, b []float64, ldb int, beta float64, c []float64, ldc int) {
	Default().Dgemm(tA, tB, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc)
}
