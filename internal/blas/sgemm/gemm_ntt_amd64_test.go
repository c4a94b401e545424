//go:build amd64 && !purego

package sgemm

import (
	"fmt"
	"math"
	"math/rand/v2"
	"runtime"
	"testing"

	"github.com/tandemml/tandem/internal/cpufeat"
)

// TestSgemmNTTiles checks the A·Bᵀ that go through the transposed tiles
// (sgemmNTT) against the definition, every element: rows of A around the
// 16-row panels, rows of B around the six-row groups and the eight-group
// blocks of Cᵀ, k around the passes and the 8×8 transposes, leading
// dimensions wider than the matrices, several alphas and betas; beta 0
// must overwrite a NaN in C, and C's padding stay as it was.
func TestSgemmNTTiles(t *testing.T) {
	if !cpufeat.FMA {
		t.Skip("no AVX/FMA kernels on this processor: Sgemm is gonum's, checked by TestGemm")
	}
	rng := rand.New(rand.NewPCG(41, 42))
	shapes := [][3]int{
		{16, 48, 64}, {17, 49, 65}, {31, 53, 71}, {64, 1024, 784}, {65, 100, 300},
		{100, 58, nttDepth + 1}, {256, 64, 2*nttDepth + 9}, {40, 6*nttGroups + 5, 129},
	}
	for x, s := range shapes {
		m, n, k := s[0], s[1], s[2]
		if !useNTT(avx2, m, n, k) {
			t.Fatalf("%dx%dx%d does not take the transposed tiles", m, n, k)
		}
		alpha := []float32{1, 0.5, -2}[x%3]
		for _, beta := range []float32{0, 1, 0.25} {
			lda, ldb, ldc := k+x%3, k+(x+1)%3, n+x%2
			a, b, c := randF32(rng, m*lda), randF32(rng, n*ldb), randF32(rng, m*ldc)
			if beta == 0 {
				c[ldc+1] = float32(math.NaN())
			}
			before := append([]float32(nil), c...)
			sgemmWith(avx2, false, true, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc)
			for i := 0; i < m; i++ {
				for j := 0; j < ldc; j++ {
					got := c[i*ldc+j]
					if j >= n {
						if math.Float32bits(got) != math.Float32bits(before[i*ldc+j]) {
							t.Fatalf("%dx%dx%d: the padding of C at (%d,%d) changed", m, n, k, i, j)
						}
						continue
					}
					var s, mag float64
					for p := 0; p < k; p++ {
						v := float64(a[i*lda+p]) * float64(b[j*ldb+p])
						s += v
						mag += math.Abs(v)
					}
					want := float64(alpha) * s
					if beta != 0 {
						want += float64(beta) * float64(before[i*ldc+j])
					}
					if math.IsNaN(float64(got)) || math.Abs(float64(got)-want) > 1e-6*float64(math.Abs(float64(alpha)))*mag+1e-5*(1+math.Abs(want)) {
						t.Fatalf("%dx%dx%d alpha %v beta %v: c[%d,%d] = %v, want %v", m, n, k, alpha, beta, i, j, got, want)
					}
				}
			}
		}
	}
}

// TestSgemmNTTilesRoundAlike: an element of C has the same bits whichever
// panel, group or edge it falls in, and however many goroutines compute
// the product: the product of A's rows 1..m with B's rows 1..n equals the
// corner of the product of rows 0..m with rows 0..n, bit for bit, with and
// without the old C, on one goroutine and on several.
func TestSgemmNTTilesRoundAlike(t *testing.T) {
	if !cpufeat.FMA {
		t.Skip("no AVX/FMA kernels on this processor")
	}
	rng := rand.New(rand.NewPCG(43, 44))
	const m, n, k = 64, 6*nttGroups*5 + 1, 2*nttDepth + 40 // 2²¹ multiply-adds and more: split
	for _, beta := range []float32{0, 0.5} {
		a, b, c := randF32(rng, (m+1)*k), randF32(rng, (n+1)*k), randF32(rng, (m+1)*(n+1))
		ldc := n + 1
		corner := make([]float32, m*n)
		for i := range m {
			copy(corner[i*n:], c[(i+1)*ldc+1:(i+1)*ldc+1+n])
		}
		one := append([]float32(nil), corner...)
		sgemmWith(avx2, false, true, m+1, n+1, k, 1.5, a, k, b, k, beta, c, ldc)
		sgemmWith(avx2, false, true, m, n, k, 1.5, a[k:], k, b[k:], k, beta, corner, n)
		procs := runtime.GOMAXPROCS(1)
		sgemmWith(avx2, false, true, m, n, k, 1.5, a[k:], k, b[k:], k, beta, one, n)
		runtime.GOMAXPROCS(procs)
		for i := range m {
			for j := range n {
				want := c[(i+1)*ldc+1+j]
				if got := corner[i*n+j]; math.Float32bits(got) != math.Float32bits(want) {
					t.Fatalf("beta %v: C[%d][%d] = %v from rows 1.. of A and B, %v from rows 0..", beta, i+1, j+1, got, want)
				}
				if got := one[i*n+j]; math.Float32bits(got) != math.Float32bits(corner[i*n+j]) {
					t.Fatalf("beta %v: C[%d][%d] = %v on one goroutine, %v on %d", beta, i+1, j+1, got, corner[i*n+j], procs)
				}
			}
		}
	}
}

// TestTransposeInto: 8×8 blocks and the edges past them, leading
// dimensions wider than the matrices.
func TestTransposeInto(t *testing.T) {
	rng := rand.New(rand.NewPCG(45, 46))
	for _, s := range [][2]int{{1, 1}, {8, 8}, {3, 17}, {16, 9}, {23, 41}, {64, 6}} {
		rows, cols := s[0], s[1]
		lds, ldd := cols+3, rows+5
		src := randF32(rng, rows*lds)
		dst := randF32(rng, cols*ldd)
		before := append([]float32(nil), dst...)
		transposeInto(dst, ldd, src, lds, rows, cols)
		for j := range cols {
			for i := range ldd {
				want := before[j*ldd+i]
				if i < rows {
					want = src[i*lds+j]
				}
				if dst[j*ldd+i] != want {
					t.Fatalf("%dx%d: dst[%d][%d] = %v, want %v", rows, cols, j, i, dst[j*ldd+i], want)
				}
			}
		}
	}
}

// BenchmarkSgemmNT times the forward products of a Linear layer in the
// 256-bit family both ways, dot products of rows (sgemmNT) and transposed
// tiles (sgemmNTT), side by side under each shape; "MB/s" is Mflop/s.
func BenchmarkSgemmNT(b *testing.B) {
	if !cpufeat.FMA {
		b.Skip("no AVX/FMA kernels on this processor")
	}
	rng := rand.New(rand.NewPCG(47, 48))
	for _, s := range [][3]int{{64, 1024, 784}, {64, 1024, 1024}, {16, 1024, 784}, {256, 1024, 1024}, {64, 48, 1024}} {
		m, n, k := s[0], s[1], s[2]
		a, bm, c := randF32(rng, m*k), randF32(rng, n*k), make([]float32, m*n)
		for _, way := range []string{"dot", "tiles"} {
			b.Run(fmt.Sprintf("%dx%dx%d/%s", m, n, k, way), func(b *testing.B) {
				b.SetBytes(int64(2 * m * n * k))
				for b.Loop() {
					if way == "dot" {
						sgemmNT(avx2, m, n, k, 1, a, k, bm, k, c, n, false)
					} else {
						sgemmNTT(m, n, k, 1, a, k, bm, k, c, n, false)
					}
				}
			})
		}
	}
}
