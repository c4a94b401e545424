package blas

import (
	"math"
	"math/rand/v2"
	"testing"

	gblas "gonum.org/v1/gonum/blas"
)

// naive computes op(A)·op(B) by the definition, in float64.
func naive(tA, tB bool, m, n, k int, a, b []float64) []float64 {
	at := func(i, l int) float64 {
		if tA {
			return a[l*m+i]
		}
		return a[i*k+l]
	}
	bt := func(l, j int) float64 {
		if tB {
			return b[j*k+l]
		}
		return b[l*n+j]
	}
	c := make([]float64, m*n)
	for i := 0; i < m; i++ {
		for j := 0; j < n; j++ {
			var s float64
			for l := 0; l < k; l++ {
				s += at(i, l) * bt(l, j)
			}
			c[i*n+j] = s
		}
	}
	return c
}

// TestGemm checks the compiled-in GEMM against the definition for every
// transpose combination, both precisions, with alpha and beta applied.
func TestGemm(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	const m, n, k = 7, 5, 9
	for _, tA := range []bool{false, true} {
		for _, tB := range []bool{false, true} {
			a := make([]float64, m*k)
			b := make([]float64, k*n)
			c0 := make([]float64, m*n)
			for i := range a {
				a[i] = rng.NormFloat64()
			}
			for i := range b {
				b[i] = rng.NormFloat64()
			}
			for i := range c0 {
				c0[i] = rng.NormFloat64()
			}
			want := naive(tA, tB, m, n, k, a, b)
			for i := range want {
				want[i] = 2*want[i] + 0.5*c0[i]
			}
			lda, ldb := k, n
			if tA {
				lda = m
			}
			if tB {
				ldb = k
			}
			ta, tb := gblas.NoTrans, gblas.NoTrans
			if tA {
				ta = gblas.Trans
			}
			if tB {
				tb = gblas.Trans
			}
			c := append([]float64(nil), c0...)
			Dgemm(ta, tb, m, n, k, 2, a, lda, b, ldb, 0.5, c, n)
			for i := range c {
				if math.Abs(c[i]-want[i]) > 1e-12*math.Max(1, math.Abs(want[i])) {
					t.Fatalf("%s Dgemm tA=%v tB=%v: c[%d]=%v, want %v", Name, tA, tB, i, c[i], want[i])
				}
			}
			a32, b32, c32 := to32(a), to32(b), to32(c0)
			Sgemm(ta, tb, m, n, k, 2, a32, lda, b32, ldb, 0.5, c32, n)
			for i := range c32 {
				if math.Abs(float64(c32[i])-want[i]) > 1e-4*math.Max(1, math.Abs(want[i])) {
					t.Fatalf("%s Sgemm tA=%v tB=%v: c[%d]=%v, want %v", Name, tA, tB, i, c32[i], want[i])
				}
			}
		}
	}
}

// TestGemv checks matrix-vector products, transposed and not.
func TestGemv(t *testing.T) {
	a := []float64{1, 2, 3, 4, 5, 6} // 2x3
	x3 := []float64{1, 0, -1}
	y := []float64{10, 20}
	Default().Dgemv(gblas.NoTrans, 2, 3, 1, a, 3, x3, 1, 1, y, 1)
	if y[0] != 8 || y[1] != 18 {
		t.Fatalf("%s Dgemv = %v, want [8 18]", Name, y)
	}
	x2 := []float32{1, 1}
	y3 := make([]float32, 3)
	Default().Sgemv(gblas.Trans, 2, 3, 1, to32(a), 3, x2, 1, 0, y3, 1)
	if y3[0] != 5 || y3[1] != 7 || y3[2] != 9 {
		t.Fatalf("%s Sgemv^T = %v, want [5 7 9]", Name, y3)
	}
}

func to32(s []float64) []float32 {
	out := make([]float32, len(s))
	for i, v := range s {
		out[i] = float32(v)
	}
	return out
}

func BenchmarkSgemm(b *testing.B) {
	const m, n, k = 64, 1024, 1024
	a := make([]float32, m*k)
	w := make([]float32, n*k)
	c := make([]float32, m*n)
	b.SetBytes(int64(2 * m * n * k)) // flops, reported as "MB/s" = Mflop/s
	for b.Loop() {
		Sgemm(gblas.NoTrans, gblas.Trans, m, n, k, 1, a, k, w, k, 0, c, n)
	}
}

// TestSgemmDispatch: products on either side of the sizes where Sgemm
// changes implementation (gonum or the kernels in the default build;
// OpenBLAS or the kernels for A·Bᵀ in the OpenBLAS build), with every
// transpose and both betas, equal gonum's to float32 rounding.
func TestSgemmDispatch(t *testing.T) {
	rng := rand.New(rand.NewPCG(23, 24))
	for _, sz := range [][3]int{{24, 40, 36}, {64, 130, 70}} {
		m, n, k := sz[0], sz[1], sz[2]
		for _, tr := range [][2]gblas.Transpose{{gblas.NoTrans, gblas.NoTrans}, {gblas.NoTrans, gblas.Trans}, {gblas.Trans, gblas.NoTrans}, {gblas.Trans, gblas.Trans}} {
			for _, beta := range []float32{0, 0.5} {
				a, b := randF32(rng, m*k), randF32(rng, k*n)
				lda, ldb := k, n
				if tr[0] == gblas.Trans {
					lda = m
				}
				if tr[1] == gblas.Trans {
					ldb = k
				}
				got := randF32(rng, m*n)
				want := append([]float32(nil), got...)
				Default().Sgemm(tr[0], tr[1], m, n, k, 1.5, a, lda, b, ldb, beta, got, n)
				pure{}.Sgemm(tr[0], tr[1], m, n, k, 1.5, a, lda, b, ldb, beta, want, n)
				for i := range got {
					if math.Abs(float64(got[i]-want[i])) > 1e-4*math.Max(1, math.Abs(float64(want[i]))) {
						t.Fatalf("%dx%dx%d %v beta %v: c[%d] = %v, gonum %v", m, n, k, tr, beta, i, got[i], want[i])
					}
				}
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
