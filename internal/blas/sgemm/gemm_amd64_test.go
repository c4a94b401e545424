//go:build amd64 && !purego

package sgemm

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/tandemml/tandem/internal/cpufeat"
	"github.com/tandemml/tandem/internal/cputime"
)

// families returns the kernel families this processor runs, the 256-bit
// one first, so that each is tested whichever one Sgemm picks.
func families(t *testing.T) []*kernels {
	var fs []*kernels
	if cpufeat.FMA {
		fs = append(fs, avx2)
	}
	if cpufeat.FMA && cpufeat.AVX512 {
		fs = append(fs, avx512)
	}
	if len(fs) == 0 {
		t.Log("no AVX/FMA here: Sgemm is gonum's, checked by TestGemm")
	}
	return fs
}

// TestSgemmFastPaths checks the tiled and the dot-product products of each
// kernel family against the definition over shapes that cover every edge of
// the tiles (m, n, k around multiples of 2, 4, 6, 8, 16 and 32, and the
// column blocks of A·Bᵀ), all four transposes, several alphas and betas,
// and leading dimensions wider than the matrices; beta 0 must overwrite a
// NaN in C.
func TestSgemmFastPaths(t *testing.T) {
	for _, kn := range families(t) {
		t.Run(kn.name, func(t *testing.T) { testFastPaths(t, kn) })
	}
}

func testFastPaths(t *testing.T, kn *kernels) {
	rng := rand.New(rand.NewPCG(21, 22))
	dims := []int{1, 2, 3, 4, 5, 6, 7, 8, 9, 12, 15, 16, 17, 31, 32, 33, 47, 63, 64, 65, 130}
	for trial := 0; trial < 400; trial++ {
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
		sgemmWith(kn, tA, tB, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc)
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

// TestSgemmNTDeep: an A·Bᵀ deeper than one pass (ntDepth terms) adds the
// passes' sums, with and without the old C, and the terms past the last
// multiple of the vector width.
func TestSgemmNTDeep(t *testing.T) {
	rng := rand.New(rand.NewPCG(29, 30))
	const m, n, k = 9, 37, 2*ntDepth + 20
	for _, kn := range families(t) {
		for _, beta := range []float32{0, 0.5} {
			a, b, c := randF32(rng, m*k), randF32(rng, n*k), randF32(rng, m*n)
			c0 := append([]float32(nil), c...)
			sgemmWith(kn, false, true, m, n, k, 1.5, a, k, b, k, beta, c, n)
			for i := 0; i < m; i++ {
				for j := 0; j < n; j++ {
					var s, mag float64
					for p := 0; p < k; p++ {
						s += float64(a[i*k+p]) * float64(b[j*k+p])
						mag += math.Abs(float64(a[i*k+p]) * float64(b[j*k+p]))
					}
					want := 1.5*s + float64(beta)*float64(c0[i*n+j])
					if got := float64(c[i*n+j]); math.Abs(got-want) > 1e-6*mag+1e-5 {
						t.Fatalf("%s beta %v: c[%d,%d] = %v, want %v", kn.name, beta, i, j, got, want)
					}
				}
			}
		}
	}
}

// TestSgemmNTEdgesRoundAsBlocks: in A·Bᵀ a row or column past the last
// whole block of the dot kernel is rounded as the blocks' are, so a row of
// C has the same bits whichever block it falls in: the product of A's rows
// 1..m equals rows 1..m of the product of A's rows 0..m, bit for bit,
// through several passes and with the old C added.
func TestSgemmNTEdgesRoundAsBlocks(t *testing.T) {
	rng := rand.New(rand.NewPCG(33, 34))
	const m, n, k = 13, 11, 2*ntDepth + 40
	for _, kn := range families(t) {
		for _, beta := range []float32{0, 0.5} {
			a, b, c := randF32(rng, (m+1)*k), randF32(rng, n*k), randF32(rng, (m+1)*n)
			shifted := append([]float32(nil), c[n:]...)
			sgemmWith(kn, false, true, m+1, n, k, 1.5, a, k, b, k, beta, c, n)
			sgemmWith(kn, false, true, m, n, k, 1.5, a[k:], k, b, k, beta, shifted, n)
			for x, v := range shifted {
				if math.Float32bits(v) != math.Float32bits(c[n+x]) {
					t.Fatalf("%s beta %v: C[%d][%d] = %v from rows 1..%d of A, %v from rows 0..%d", kn.name, beta, 1+x/n, x%n, v, m, c[n+x], m)
				}
			}
		}
	}
}

// TestSgemmTilesDeep: a tiled product deeper than one pass (tileDepth
// terms) adds the passes' sums, with and without the old C, for all four
// transposes, with B's columns in several column blocks (the last an
// edge) and rows enough for the 512-bit family to pack B while computing
// the first row block.
func TestSgemmTilesDeep(t *testing.T) {
	rng := rand.New(rand.NewPCG(31, 32))
	// n spans three of the 256-bit family's panel groups (colGroup), the
	// last short, and its last block is ragged.
	const m, n, k, pad = 19, 2*256 + 37, 2*tileDepth + 21, 3
	for _, kn := range families(t) {
		for _, tr := range [][2]bool{{false, false}, {true, false}, {false, true}, {true, true}} {
			tA, tB := tr[0], tr[1]
			for _, beta := range []float32{0, 0.5} {
				lda, ldb := k+pad, n+pad
				ar, br := m, k
				if tA {
					lda, ar = m+pad, k
				}
				if tB {
					ldb, br = k+pad, n
				}
				a, b, c := randF32(rng, ar*lda), randF32(rng, br*ldb), randF32(rng, m*n)
				c0 := append([]float32(nil), c...)
				sgemmWith(kn, tA, tB, m, n, k, 1.5, a, lda, b, ldb, beta, c, n)
				for i := 0; i < m; i++ {
					for j := 0; j < n; j++ {
						var s, mag float64
						for p := 0; p < k; p++ {
							ai, bi := i*lda+p, p*ldb+j
							if tA {
								ai = p*lda + i
							}
							if tB {
								bi = j*ldb + p
							}
							av, bv := a[ai], b[bi]
							s += float64(av) * float64(bv)
							mag += math.Abs(float64(av) * float64(bv))
						}
						want := 1.5*s + float64(beta)*float64(c0[i*n+j])
						if got := float64(c[i*n+j]); math.Abs(got-want) > 1e-6*mag+1e-5 {
							t.Fatalf("%s tA=%v tB=%v beta %v: c[%d,%d] = %v, want %v", kn.name, tA, tB, beta, i, j, got, want)
						}
					}
				}
			}
		}
	}
}

// TestSgemmPicksTheWidestFamily: Sgemm and Core use the AVX-512 kernels
// where the processor has them and the AVX2 ones where it has only those.
func TestSgemmPicksTheWidestFamily(t *testing.T) {
	want := "go"
	switch {
	case cpufeat.FMA && cpufeat.AVX512:
		want = "go-avx512"
	case cpufeat.FMA:
		want = "go-fma"
	}
	if got := Core(); got != want {
		t.Fatalf("Core() = %q on a processor with FMA %v, AVX512 %v; want %q", got, cpufeat.FMA, cpufeat.AVX512, want)
	}
}

// mlpGemms are the products of one training step of the MLP
// 784-1024-1024-10 at batch 64, as Linear and its gradients call them: the
// forward x·Wᵀ, the weight gradients dYᵀ·X and the input gradients dY·W
// (the first layer's input needs none).
var mlpGemms = []struct {
	name           string
	transA, transB bool
	m, n, k        int
}{
	{"fwd1", false, true, 64, 1024, 784},
	{"fwd2", false, true, 64, 1024, 1024},
	{"fwd3", false, true, 64, 10, 1024},
	{"dW3", true, false, 10, 1024, 64},
	{"dX3", false, false, 64, 1024, 10},
	{"dW2", true, false, 1024, 1024, 64},
	{"dX2", false, false, 64, 1024, 1024},
	{"dW1", true, false, 1024, 784, 64},
}

// mlpOperands returns A, B and C for one of mlpGemms, with their leading
// dimensions.
func mlpOperands(rng *rand.Rand, transA, transB bool, m, n, k int) (a []float32, lda int, b []float32, ldb int, c []float32) {
	lda, ldb = k, n
	if transA {
		lda = m
	}
	if transB {
		ldb = k
	}
	return randF32(rng, m*k), lda, randF32(rng, k*n), ldb, make([]float32, m*n)
}

// TestSgemmMLPShapes: every family computes the step's real products (large
// k, the 784-wide edge, the 10-row and 10-column ones) to float32 rounding
// of the definition, checked in float64 at 300 entries of each.
func TestSgemmMLPShapes(t *testing.T) {
	rng := rand.New(rand.NewPCG(25, 26))
	for _, kn := range families(t) {
		for _, g := range mlpGemms {
			a, lda, b, ldb, c := mlpOperands(rng, g.transA, g.transB, g.m, g.n, g.k)
			sgemmWith(kn, g.transA, g.transB, g.m, g.n, g.k, 0.5, a, lda, b, ldb, 0, c, g.n)
			for e := 0; e < 300; e++ {
				i, j := rng.IntN(g.m), rng.IntN(g.n)
				if e < 4 { // the corners
					i, j = (e&1)*(g.m-1), (e>>1)*(g.n-1)
				}
				var s, mag float64
				for p := 0; p < g.k; p++ {
					ai, bi := i*lda+p, p*ldb+j
					if g.transA {
						ai = p*lda + i
					}
					if g.transB {
						bi = j*ldb + p
					}
					av, bv := a[ai], b[bi]
					s += float64(av) * float64(bv)
					mag += math.Abs(float64(av) * float64(bv))
				}
				want := 0.5 * s
				if got := float64(c[i*g.n+j]); math.Abs(got-want) > 1e-6*mag+1e-6 {
					t.Fatalf("%s %s (%dx%dx%d): c[%d,%d] = %v, want %v", kn.name, g.name, g.m, g.n, g.k, i, j, got, want)
				}
			}
		}
	}
}

// BenchmarkSgemmMLP times each product of the MLP's step in each family,
// the families side by side under each shape, so that -count rounds
// interleave them; "MB/s" is Mflop/s. The Step benchmark runs the step's
// eight products in a row.
func BenchmarkSgemmMLP(b *testing.B) {
	rng := rand.New(rand.NewPCG(27, 28))
	fams := []*kernels{avx2, avx512}
	if !cpufeat.AVX512 {
		fams = fams[:1]
	}
	if !cpufeat.FMA {
		b.Skip("no AVX/FMA kernels on this processor")
	}
	type ops struct {
		a, b, c  []float32
		lda, ldb int
	}
	all := make([]ops, len(mlpGemms))
	flops := 0
	for i, g := range mlpGemms {
		o := &all[i]
		o.a, o.lda, o.b, o.ldb, o.c = mlpOperands(rng, g.transA, g.transB, g.m, g.n, g.k)
		flops += 2 * g.m * g.n * g.k
	}
	for i, g := range mlpGemms {
		o := all[i]
		for _, kn := range fams {
			b.Run(fmt.Sprintf("%s_%dx%dx%d/%s", g.name, g.m, g.n, g.k, kn.name), func(b *testing.B) {
				b.SetBytes(int64(2 * g.m * g.n * g.k))
				cpu0 := cputime.Process()
				for b.Loop() {
					sgemmWith(kn, g.transA, g.transB, g.m, g.n, g.k, 1, o.a, o.lda, o.b, o.ldb, 0, o.c, g.n)
				}
				reportCPU(b, cpu0, 2*g.m*g.n*g.k)
			})
		}
	}
	for _, kn := range fams {
		b.Run("Step/"+kn.name, func(b *testing.B) {
			b.SetBytes(int64(flops))
			cpu0 := cputime.Process()
			for b.Loop() {
				for i, g := range mlpGemms {
					o := all[i]
					sgemmWith(kn, g.transA, g.transB, g.m, g.n, g.k, 1, o.a, o.lda, o.b, o.ldb, 0, o.c, g.n)
				}
			}
			reportCPU(b, cpu0, flops)
		})
	}
}

// reportCPU adds the CPU time an iteration took since cpu0 (in ms), the
// figure that holds when other processes compete for the cores, and the
// Gflop/s of flops an iteration at that time.
func reportCPU(b *testing.B, cpu0 time.Duration, flops int) {
	cpu := cputime.Process() - cpu0
	if cpu <= 0 || b.N == 0 {
		return
	}
	per := cpu.Seconds() / float64(b.N)
	b.ReportMetric(per*1e3, "cpu-ms/op")
	b.ReportMetric(float64(flops)/per/1e9, "cpu-Gflop/s")
}

func randF32(rng *rand.Rand, n int) []float32 {
	s := make([]float32, n)
	for i := range s {
		s[i] = float32(rng.NormFloat64())
	}
	return s
}
