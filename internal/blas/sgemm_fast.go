//go:build amd64 && !purego && !openblas

package blas

import (
	"runtime"
	"sync"

	gblas "gonum.org/v1/gonum/blas"

	"github.com/tandemml/tandem/internal/cpufeat"
)

// goFast is gonum's BLAS with the float32 matrix product, the one training
// spends its time in, computed in 4x16 tiles of AVX fused multiply-adds
// where the processor has them.
type goFast struct{ pure }

//go:noescape
func sgemmTile6x16(k int, a, b, c *float32, ldc int, alpha float32)

//go:noescape
func sdot2x4(k int, a *float32, lda int, b *float32, ldb int, out *float32)

// fastSgemm: the processor runs the kernels.
var fastSgemm = cpufeat.FMA

// fastFrom is the size (m·n·k) from which the tiled product pays for its
// packing; smaller products go to gonum.
const fastFrom = 1 << 12

func (goFast) Sgemm(tA, tB gblas.Transpose, m, n, k int, alpha float32, a []float32, lda int, b []float32, ldb int, beta float32, c []float32, ldc int) {
	if !fastSgemm || m*n*k < fastFrom || alpha == 0 || !gemmArgsOK(tA, tB, m, n, k, len(a), lda, len(b), ldb, len(c), ldc) {
		// gonum also reports bad arguments, with its own panics.
		pure{}.Sgemm(tA, tB, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc)
		return
	}
	scaleRows(m, n, beta, c, ldc)
	if tA == gblas.NoTrans && tB == gblas.Trans {
		// A·Bᵀ: rows of A against rows of B, both contiguous, nothing to pack.
		sgemmNT(m, n, k, alpha, a, lda, b, ldb, c, ldc)
		return
	}
	sgemmTiles(tA == gblas.Trans, tB == gblas.Trans, m, n, k, alpha, a, lda, b, ldb, c, ldc)
}

// scaleRows multiplies the m×n matrix C by beta; beta 0 writes zeros
// whatever C held (NaN included), as BLAS does.
func scaleRows(m, n int, beta float32, c []float32, ldc int) {
	for i := 0; i < m; i++ {
		row := c[i*ldc : i*ldc+n]
		switch beta {
		case 0:
			clear(row)
		case 1:
		default:
			for j := range row {
				row[j] *= beta
			}
		}
	}
}

// ntBlock is how many rows of B the A·Bᵀ product keeps in the cache while
// every row pair of A passes over them.
const ntBlock = 128

// sgemmNT adds alpha·A·Bᵀ to C, A m×k and B n×k: 2x4 blocks of dot
// products in the vector kernel, the edges and the last k%8 terms in Go.
func sgemmNT(m, n, k int, alpha float32, a []float32, lda int, b []float32, ldb int, c []float32, ldc int) {
	k8 := k &^ 7
	dot := func(i, j int) float32 {
		var s float32
		ar, br := a[i*lda:i*lda+k], b[j*ldb:j*ldb+k]
		for p, v := range ar {
			s += v * br[p]
		}
		return s
	}
	var out [8]float32
	for jb := 0; jb < n; jb += ntBlock {
		je := min(jb+ntBlock, n)
		j4 := jb + (je-jb)&^3
		for i := 0; i < m; i += 2 {
			if i+1 == m { // the last row alone
				for j := jb; j < je; j++ {
					c[i*ldc+j] += alpha * dot(i, j)
				}
				continue
			}
			for j := jb; j < j4; j += 4 {
				if k8 > 0 {
					sdot2x4(k8, &a[i*lda], lda, &b[j*ldb], ldb, &out[0])
				}
				for r := 0; r < 2; r++ {
					ar := a[(i+r)*lda : (i+r)*lda+k]
					for cc := 0; cc < 4; cc++ {
						s := out[r*4+cc]
						if k8 == 0 {
							s = 0
						}
						br := b[(j+cc)*ldb : (j+cc)*ldb+k]
						for p := k8; p < k; p++ {
							s += ar[p] * br[p]
						}
						c[(i+r)*ldc+j+cc] += alpha * s
					}
				}
			}
			for j := j4; j < je; j++ {
				c[i*ldc+j] += alpha * dot(i, j)
				c[(i+1)*ldc+j] += alpha * dot(i+1, j)
			}
		}
	}
}

// gemmArgsOK checks the shapes as the reference BLAS does: transposes
// known, leading dimensions and slice lengths large enough.
func gemmArgsOK(tA, tB gblas.Transpose, m, n, k, la, lda, lb, ldb, lc, ldc int) bool {
	if tA != gblas.NoTrans && tA != gblas.Trans || tB != gblas.NoTrans && tB != gblas.Trans || m <= 0 || n <= 0 || k <= 0 {
		return false
	}
	ar, ac := m, k
	if tA == gblas.Trans {
		ar, ac = k, m
	}
	br, bc := k, n
	if tB == gblas.Trans {
		br, bc = n, k
	}
	return lda >= max(1, ac) && ldb >= max(1, bc) && ldc >= max(1, n) &&
		la >= lda*(ar-1)+ac && lb >= ldb*(br-1)+bc && lc >= ldc*(m-1)+n
}

var panelPool sync.Pool // of *[]float32

func getPanel(n int) *[]float32 {
	if p, ok := panelPool.Get().(*[]float32); ok && cap(*p) >= n {
		*p = (*p)[:n]
		return p
	}
	s := make([]float32, n)
	return &s
}

// sgemmTiles adds alpha·op(A)·op(B) to C (row major): A is packed into
// panels of 6 rows and B into panels of 16 columns (zero-padded at the
// edges), and the tile kernel adds alpha times each 6x16 tile's sums into
// C, straight into it away from the edges.
func sgemmTiles(transA, transB bool, m, n, k int, alpha float32, a []float32, lda int, b []float32, ldb int, c []float32, ldc int) {
	mp := (m + 5) / 6
	pap := getPanel(mp * 6 * k)
	defer panelPool.Put(pap)
	pa := *pap
	for ib := 0; ib < mp; ib++ {
		panel := pa[ib*6*k : (ib+1)*6*k]
		for r := 0; r < 6; r++ {
			i := ib*6 + r
			switch {
			case i >= m:
				for p := 0; p < k; p++ {
					panel[p*6+r] = 0
				}
			case transA:
				for p := 0; p < k; p++ {
					panel[p*6+r] = a[p*lda+i]
				}
			default:
				for p, v := range a[i*lda : i*lda+k] {
					panel[p*6+r] = v
				}
			}
		}
	}
	nb := (n + 15) / 16
	workers := 1
	if m*n*k >= 1<<21 {
		workers = min(runtime.GOMAXPROCS(0), nb, 8)
	}
	if workers <= 1 {
		sgemmColumns(0, nb, transB, m, n, k, alpha, pa, b, ldb, c, ldc)
		return
	}
	var wg sync.WaitGroup
	per := (nb + workers - 1) / workers
	for lo := 0; lo < nb; lo += per {
		wg.Add(1)
		go func(lo, hi int) {
			defer wg.Done()
			sgemmColumns(lo, hi, transB, m, n, k, alpha, pa, b, ldb, c, ldc)
		}(lo, min(lo+per, nb))
	}
	wg.Wait()
}

// sgemmColumns computes the tiles of the 16-column blocks lo..hi-1.
func sgemmColumns(lo, hi int, transB bool, m, n, k int, alpha float32, pa, b []float32, ldb int, c []float32, ldc int) {
	pbp := getPanel(16 * k)
	defer panelPool.Put(pbp)
	pb := *pbp
	var edge [96]float32
	for jb := lo; jb < hi; jb++ {
		j := jb * 16
		w := min(16, n-j)
		if transB {
			for jj := 0; jj < 16; jj++ {
				if jj >= w {
					for p := 0; p < k; p++ {
						pb[p*16+jj] = 0
					}
					continue
				}
				for p, v := range b[(j+jj)*ldb : (j+jj)*ldb+k] {
					pb[p*16+jj] = v
				}
			}
		} else {
			for p := 0; p < k; p++ {
				dst := pb[p*16 : p*16+16]
				n := copy(dst, b[p*ldb+j:p*ldb+j+w])
				clear(dst[n:])
			}
		}
		for i := 0; i < m; i += 6 {
			panel := &pa[i*k]
			if i+6 <= m && w == 16 {
				sgemmTile6x16(k, panel, &pb[0], &c[i*ldc+j], ldc, alpha)
				continue
			}
			clear(edge[:])
			sgemmTile6x16(k, panel, &pb[0], &edge[0], 16, alpha)
			for r := 0; r < min(6, m-i); r++ {
				crow := c[(i+r)*ldc+j : (i+r)*ldc+j+w]
				for jj, v := range edge[r*16 : r*16+w] {
					crow[jj] += v
				}
			}
		}
	}
}
