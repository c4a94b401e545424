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

// nttFamilies are the kernel families whose transposed tiles this
// processor runs, each with shapes that take them (useNTT): rows of A
// around the panels, rows of B around the groups and the eight-group
// blocks of Cᵀ, k around the passes and the 8×8 transposes.
func nttFamilies(t *testing.T) map[*kernels][][3]int {
	if !cpufeat.FMA {
		t.Skip("no AVX/FMA kernels on this processor: Sgemm is gonum's, checked by TestGemm")
	}
	fams := map[*kernels][][3]int{avx2: {
		{16, 48, 64}, {17, 49, 65}, {31, 53, 71}, {64, 1024, 784}, {65, 100, 300},
		{100, 58, nttDepth + 1}, {256, 64, 2*nttDepth + 9}, {40, 6*nttGroups + 5, 129},
	}}
	if best == avx512 {
		fams[avx512] = [][3]int{
			{32, 48, 64}, {30, 49, 65}, {64, 1024, 784}, {60, 100, 300}, {96, 53, 71},
			{128, 58, nttDepth + 1}, {256, 64, 2*nttDepth + 9}, {64, 8*nttGroups + 5, 129},
		}
	}
	for kn, shapes := range fams {
		for _, s := range shapes {
			if !useNTT(kn, s[0], s[1], s[2]) {
				t.Fatalf("%s: %dx%dx%d does not take the transposed tiles", kn.name, s[0], s[1], s[2])
			}
		}
	}
	return fams
}

// TestSgemmNTTiles checks the A·Bᵀ that go through the transposed tiles
// (sgemmNTT) of each family against the definition, every element, on the
// shapes of nttFamilies, leading dimensions wider than the matrices,
// several alphas and betas; beta 0 must overwrite a NaN in C, and C's
// padding stay as it was.
func TestSgemmNTTiles(t *testing.T) {
	for kn, shapes := range nttFamilies(t) {
		t.Run(kn.name, func(t *testing.T) { checkNTTiles(t, kn, shapes) })
	}
}

func checkNTTiles(t *testing.T, kn *kernels, shapes [][3]int) {
	rng := rand.New(rand.NewPCG(41, 42))
	for x, s := range shapes {
		m, n, k := s[0], s[1], s[2]
		alpha := []float32{1, 0.5, -2}[x%3]
		for _, beta := range []float32{0, 1, 0.25} {
			lda, ldb, ldc := k+x%3, k+(x+1)%3, n+x%2
			a, b, c := randF32(rng, m*lda), randF32(rng, n*ldb), randF32(rng, m*ldc)
			if beta == 0 {
				c[ldc+1] = float32(math.NaN())
			}
			before := append([]float32(nil), c...)
			sgemmWith(kn, false, true, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc)
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
// without the old C, on one goroutine and on several, in each family.
func TestSgemmNTTilesRoundAlike(t *testing.T) {
	for kn := range nttFamilies(t) {
		t.Run(kn.name, func(t *testing.T) { checkNTTilesRoundAlike(t, kn) })
	}
}

func checkNTTilesRoundAlike(t *testing.T, kn *kernels) {
	rng := rand.New(rand.NewPCG(43, 44))
	// 2²¹ multiply-adds and more: split. For the 512-bit family 64 rows
	// and 63 once the corner drops row 0, both within its panels' padding.
	m, n, k := 64, 6*nttGroups*5+1, 2*nttDepth+40
	if kn.wide {
		m, n = 63, 8*nttGroups*5+1
	}
	for _, beta := range []float32{0, 0.5} {
		a, b, c := randF32(rng, (m+1)*k), randF32(rng, (n+1)*k), randF32(rng, (m+1)*(n+1))
		ldc := n + 1
		corner := make([]float32, m*n)
		for i := range m {
			copy(corner[i*n:], c[(i+1)*ldc+1:(i+1)*ldc+1+n])
		}
		one := append([]float32(nil), corner...)
		sgemmWith(kn, false, true, m+1, n+1, k, 1.5, a, k, b, k, beta, c, ldc)
		sgemmWith(kn, false, true, m, n, k, 1.5, a[k:], k, b[k:], k, beta, corner, n)
		procs := runtime.GOMAXPROCS(1)
		sgemmWith(kn, false, true, m, n, k, 1.5, a[k:], k, b[k:], k, beta, one, n)
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

// TestSgemmNTTilesFamiliesAlike: the 512-bit transposed tiles round as the
// 256-bit ones do, bit for bit (each element one chain of FMAs over each
// pass, alpha and the old C in one more), with and without the old C.
func TestSgemmNTTilesFamiliesAlike(t *testing.T) {
	fams := nttFamilies(t)
	if fams[avx512] == nil {
		t.Skip("no AVX-512 kernels on this processor: one family only")
	}
	rng := rand.New(rand.NewPCG(49, 50))
	for _, s := range fams[avx512] {
		m, n, k := s[0], s[1], s[2]
		for _, beta := range []float32{0, 0.75} {
			a, b, c := randF32(rng, m*k), randF32(rng, n*k), randF32(rng, m*n)
			wide := append([]float32(nil), c...)
			sgemmWith(avx2, false, true, m, n, k, -1.25, a, k, b, k, beta, c, n)
			sgemmWith(avx512, false, true, m, n, k, -1.25, a, k, b, k, beta, wide, n)
			for i := range c {
				if math.Float32bits(c[i]) != math.Float32bits(wide[i]) {
					t.Fatalf("%dx%dx%d beta %v: C[%d][%d] = %v in the 512-bit tiles, %v in the 256-bit ones", m, n, k, beta, i/n, i%n, wide[i], c[i])
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
		for _, way := range []string{"dot", "tiles", "dot512", "tiles512"} {
			if (way == "dot512" || way == "tiles512") && best != avx512 {
				continue
			}
			b.Run(fmt.Sprintf("%dx%dx%d/%s", m, n, k, way), func(b *testing.B) {
				b.SetBytes(int64(2 * m * n * k))
				for b.Loop() {
					switch way {
					case "dot":
						sgemmNT(avx2, m, n, k, 1, a, k, bm, k, c, n, false)
					case "dot512":
						sgemmNT(avx512, m, n, k, 1, a, k, bm, k, c, n, false)
					case "tiles":
						sgemmNTT(avx2, m, n, k, 1, a, k, bm, k, c, n, false)
					default:
						sgemmNTT(avx512, m, n, k, 1, a, k, bm, k, c, n, false)
					}
				}
			})
		}
	}
}
