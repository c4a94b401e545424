//go:build !openblas

package blas

import (
	gblas "gonum.org/v1/gonum/blas"

	"github.com/tandemml/tandem/internal/blas/sgemm"
)

// goFast is gonum's BLAS with the float32 matrix product, the one training
// spends its time in, computed in package sgemm's vector kernels where the
// processor has them.
type goFast struct{ pure }

func (goFast) Sgemm(tA, tB gblas.Transpose, m, n, k int, alpha float32, a []float32, lda int, b []float32, ldb int, beta float32, c []float32, ldc int) {
	if known(tA) && known(tB) && sgemm.Gemm(tA == gblas.Trans, tB == gblas.Trans, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc) {
		return
	}
	// gonum also reports bad arguments, with its own panics.
	pure{}.Sgemm(tA, tB, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc)
}

// known reports whether t is one of the two transposes the kernels take
// (gonum reports any other).
func known(t gblas.Transpose) bool { return t == gblas.NoTrans || t == gblas.Trans }
