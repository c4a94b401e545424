//go:build amd64 && !purego && !openblas

package blas

import (
	"math"
	"math/rand/v2"
	"testing"

	gblas "gonum.org/v1/gonum/blas"

	"github.com/tandemml/tandem/internal/cpufeat"
)

// TestSgemmFastPaths checks the tiled and the dot-product products against
// the definition over shapes that cover every edge of the tiles (m, n, k
// around multiples of 2, 4, 8 and 16, and the column blocks of A·Bᵀ), all
// four transposes, several alphas and betas, and leading dimensions wider
// than the matrices; beta 0 must overwrite a NaN in C.
func TestSgemmFastPaths(t *testing.T) {
	if !cpufeat.FMA {
		t.Log("no AVX/FMA here: Sgemm is gonum's, checked by TestGemm")
		return
	}
	rng := rand.New(rand.NewPCG(21, 22))
	dims := []int{1, 2, 3, 4, 5, 7, 8, 9, 15, 16, 17, 33, 130}
	for trial := 0; trial < 300; trial++ {
		m, n, k := dims[rng.IntN(len(dims))], dims[rng.IntN(len(dims))], dims[rng.IntN(len(dims))]
		tA, tB := rng.IntN(2) == 1, rng.IntN(2) == 1
		alpha := []float32{1, 0.5, -2}[rng.IntN(3)]
		beta := []float32{0, 1, 0.25}[rng.IntN(3)]
		pad := rng.IntN(3)
		ar, ac := m, k
		if tA {
			ar, ac = k, m
		}
		br, bc := k, n
		if tB {
			br, bc = n, k
		}
		lda, ldb, ldc := ac+pad, bc+pad, n+pad
		a, b, c := randF32(rng, ar*lda), randF32(rng, br*ldb), randF32(rng, m*ldc)
		if beta == 0 {
			c[0] = float32(math.NaN())
		}
		want := make([]float64, m*n)
		for i := 0; i < m; i++ {
			for j := 0; j < n; j++ {
				var s float64
				for p := 0; p < k; p++ {
					var av, bv float32
					if tA {
						av = a[p*lda+i]
					} else {
						av = a[i*lda+p]
					}
					if tB {
						bv = b[j*ldb+p]
					} else {
						bv = b[p*ldb+j]
					}
					s += float64(av) * float64(bv)
				}
				cv := float64(beta) * float64(c[i*ldc+j])
				if beta == 0 {
					cv = 0
				}
				want[i*n+j] = float64(alpha)*s + cv
			}
		}
		before := append([]float32(nil), c...)
		scaleRows(m, n, beta, c, ldc)
		if !tA && tB {
			sgemmNT(m, n, k, alpha, a, lda, b, ldb, c, ldc)
		} else {
			sgemmTiles(tA, tB, m, n, k, alpha, a, lda, b, ldb, c, ldc)
		}
		for i := 0; i < m; i++ {
			for j := 0; j < ldc; j++ {
				got := c[i*ldc+j]
				if j >= n {
					if math.Float32bits(got) != math.Float32bits(before[i*ldc+j]) {
						t.Fatalf("m=%d n=%d k=%d: the padding of C at (%d,%d) changed", m, n, k, i, j)
					}
					continue
				}
				w := want[i*n+j]
				if math.IsNaN(float64(got)) || math.Abs(float64(got)-w) > 1e-4*(1+math.Sqrt(float64(k)))*math.Max(1, math.Abs(w)) {
					t.Fatalf("m=%d n=%d k=%d tA=%v tB=%v alpha=%v beta=%v: c[%d,%d] = %v, want %v", m, n, k, tA, tB, alpha, beta, i, j, got, w)
				}
			}
		}
	}
}

// TestSgemmDispatch: a product large enough goes through the fast paths
// from the public Sgemm, and equals gonum's to float32 rounding.
func TestSgemmDispatch(t *testing.T) {
	rng := rand.New(rand.NewPCG(23, 24))
	const m, n, k = 24, 40, 36
	for _, tr := range [][2]gblas.Transpose{{gblas.NoTrans, gblas.NoTrans}, {gblas.NoTrans, gblas.Trans}, {gblas.Trans, gblas.NoTrans}, {gblas.Trans, gblas.Trans}} {
		a, b := randF32(rng, m*k), randF32(rng, k*n)
		lda, ldb := k, n
		if tr[0] == gblas.Trans {
			lda = m
		}
		if tr[1] == gblas.Trans {
			ldb = k
		}
		got, want := make([]float32, m*n), make([]float32, m*n)
		Default().Sgemm(tr[0], tr[1], m, n, k, 1.5, a, lda, b, ldb, 0, got, n)
		pure{}.Sgemm(tr[0], tr[1], m, n, k, 1.5, a, lda, b, ldb, 0, want, n)
		for i := range got {
			if math.Abs(float64(got[i]-want[i])) > 1e-4*math.Max(1, math.Abs(float64(want[i]))) {
				t.Fatalf("%v: c[%d] = %v, gonum %v", tr, i, got[i], want[i])
			}
		}
	}
}

func randF32(rng *rand.Rand, n int) []float32 {
	s := make([]float32, n)
	for i := range s {
		s[i] = float32(rng.NormFloat64())
	}
	return s
}
