//go:build amd64 && !purego

package sgemm

import "runtime"

//go:noescape
func sgemmTile6x16R(k int, a *float32, lda int, b *float32, ldb int, c *float32, ldc int, alpha float32, acc bool)

//go:noescape
func sgemmTile8x32R(k int, a *float32, lda int, b *float32, ldb int, c *float32, ldc int, alpha float32, acc bool)

// tileR runs the family's tile kernel on mr rows of A read in place, lda
// apart (sgemmTile6x16R, sgemmTile8x32R), and a packed nr-column panel.
func (kn *kernels) tileR(k int, a *float32, lda int, b *float32, ldb int, c *float32, ldc int, alpha float32, acc bool) {
	if kn.wide {
		sgemmTile8x32R(k, a, lda, b, ldb, c, ldc, alpha, acc)
	} else {
		sgemmTile6x16R(k, a, lda, b, ldb, c, ldc, alpha, acc)
	}
}

// A·Bᵀ as the transpose of B·Aᵀ, in the tile kernels.
//
// The forward product of a Linear layer, X·Wᵀ with X a batch of rows and W
// the weight's rows, reads both operands along k. Dot products of rows
// (sdot3x4) load a vector of each for every multiply-add: seven loads for
// twelve FMAs, more than the level-1 cache feeds from level 2 once B's
// block and A's rows outgrow it. The tile kernel's outer product loads two
// vectors and broadcasts six elements for twelve FMAs, but needs the
// vector operand contiguous along C's columns, which neither X nor W is.
// Transposed, (X·Wᵀ)ᵀ = W·Xᵀ is that kernel's product with W's rows
// broadcast where they lie (sgemmTile6x16R, six rows at a time; in the
// 512-bit family sgemmTile8x32R, eight) and Xᵀ packed in panels of 16 of
// X's rows (32 in the 512-bit family): a copy of X, the small operand, and
// none of W. The tiles go to a buffer holding part of Cᵀ, transposed into
// C. As in the tiled products, every element of C is one chain of FMAs in
// order over each pass's terms (nttDepth), whose sum times alpha is added
// to the last pass's (to the old C when adding) in one FMA: the same
// arithmetic whichever tile or edge the element falls in, and whichever
// family computes it.

// Which A·Bᵀ go this way: a batch of rows (nttMinRows to nttMaxRows, so
// that Xᵀ's panels stay in the level-2 cache), enough of B's rows to fill
// the six-row groups, and k deep enough to pay for the transposes. On a
// Zen 3 core (GOMAXPROCS=1, BenchmarkSgemmNT, 2026-12-02) the tiles took
// 64×1024 over 784 and 1024 terms from 53 and 50 Gflop/s to 63-70 and
// 64-72, 16, 32, 128 and 256 rows gained as much, and 32 columns of B
// were no faster.
//
// The 512-bit family takes the batches that fill its 32-row panels with at
// most an eighth of them padding (32, 64, 128 and 256 rows; not 16 or 48:
// its dot products, sdot4x4, compute those). Its dot products read B's
// eight rows of up to 1024 terms and A's four, more than the level-1
// cache holds, where the tiles stream a panel past W's rows. On a Zen 4
// core (GOMAXPROCS=1, BenchmarkSgemmNT, three rounds, 2026-12-03), in
// Gflop/s, 512-bit tiles against 512-bit dots: 64×1024 over 784 terms
// 99-102 against 92-99, over 1024 terms 85-98 against 73-76, 256×1024
// over 1024 terms 98-102 against 83-88; the 256-bit tiles 90-99, 79-86
// and 90-93. The step's eight products (the MLP's, one core, the two
// ways alternating, 400 steps, three runs) took 7.4, 8.0 and 8.1 ms at the
// median against 7.7, 8.6 and 8.9.
const (
	nttMinRows = 16
	nttMaxRows = 256
	nttMinCols = 48
	nttMinK    = 64
	// nttGroups is how many six-row groups of Cᵀ are computed before
	// they are transposed into C: 48 rows, 12 KiB for a batch of 64.
	nttGroups = 8
	// nttDepth is how many terms one pass of the kernel takes: a panel's
	// nttDepth×16 floats, 16 KiB.
	nttDepth = 256
)

// useNTT reports whether sgemmWith computes the m×n A·Bᵀ over k terms
// with sgemmNTT in the kernels kn.
func useNTT(kn *kernels, m, n, k int) bool {
	if m < nttMinRows || m > nttMaxRows || n < nttMinCols || k < nttMinK {
		return false
	}
	if !kn.wide {
		return true
	}
	cols := (m + kn.nr - 1) / kn.nr * kn.nr // the panels' columns, padding included
	return 8*(cols-m) <= cols
}

// sgemmNTT writes (acc: adds) alpha·A·Bᵀ to C, A m×k and B n×k, both row
// major, in the tile kernels of kn (mr rows of B, panels of nr rows of
// A): see above. Products of 2²¹ multiply-adds and more split B's row
// groups among up to productThreads goroutines.
func sgemmNTT(kn *kernels, m, n, k int, alpha float32, a []float32, lda int, b []float32, ldb int, c []float32, ldc int, acc bool) {
	mr, nr := kn.mr, kn.nr
	cp := (m + nr - 1) / nr // panels of Aᵀ
	ldt := cp * nr
	groups := (n + mr - 1) / mr
	pbp := getPanel(cp * nr * k)
	defer panelPool.Put(pbp)
	pb := *pbp
	for q := range cp {
		// Panel q: rows q·nr.. of A transposed, k rows of nr, padded past
		// m with zeros (whose columns of Cᵀ are not copied into C: the
		// zeros only keep stale values, denormals among them, out of the
		// kernel).
		panel, rows := pb[q*k*nr:(q+1)*k*nr], min(nr, m-q*nr)
		transposeInto(panel, nr, a[q*nr*lda:], lda, rows, k)
		if rows < nr {
			for p := range k {
				clear(panel[p*nr+rows : p*nr+nr])
			}
		}
	}
	run := func(g0, g1 int) {
		// Cᵀ goes through a buffer nttGroups groups of rows at a time,
		// transposed into C while it is in the level-1 cache.
		tp := getPanel(nttGroups * mr * ldt)
		defer panelPool.Put(tp)
		t := *tp
		for h0 := g0; h0 < g1; h0 += nttGroups {
			h1 := min(h0+nttGroups, g1)
			j0, j1 := h0*mr, min(h1*mr, n)
			if acc {
				transposeInto(t, ldt, c[j0:], ldc, m, j1-j0)
			}
			// Each group's rows of B: in place, or a copy for the last
			// group, padded with zeros (the kernel reads mr).
			var src [nttGroups][]float32
			var lds [nttGroups]int
			for g := h0; g < h1; g++ {
				j := g * mr
				if j+mr <= n {
					src[g-h0], lds[g-h0] = b[j*ldb:], ldb
					continue
				}
				ep := getPanel(mr * k)
				defer panelPool.Put(ep)
				e := *ep
				for r := range mr {
					er := e[r*k : r*k+k]
					if j+r < n {
						copy(er, b[(j+r)*ldb:(j+r)*ldb+k])
					} else {
						clear(er)
					}
				}
				src[g-h0], lds[g-h0] = e, k
			}
			// Passes over nttDepth terms: a panel's part stays in the
			// level-1 cache while the groups go past it.
			for p0 := 0; p0 < k; p0 += nttDepth {
				d := min(nttDepth, k-p0)
				add := acc || p0 > 0
				for q := range cp {
					panel := &pb[q*k*nr+p0*nr]
					for g := h0; g < h1; g++ {
						j := g * mr
						kn.tileR(d, &src[g-h0][p0], lds[g-h0], panel, nr, &t[(j-j0)*ldt+q*nr], ldt, alpha, add)
					}
				}
			}
			transposeInto(c[j0:], ldc, t, ldt, j1-j0, m)
		}
	}
	workers := 1
	if m*n*k >= 1<<21 {
		workers = min(runtime.GOMAXPROCS(0), groups, productThreads)
	}
	inParallel(groups, workers, run)
}

//go:noescape
func transpose8(dst *float32, ldd int, src *float32, lds int)

// transposeInto writes the transpose of the rows×cols matrix src (leading
// dimension lds) into dst (leading dimension ldd): dst[j*ldd+i] =
// src[i*lds+j], in 8×8 blocks in registers (transpose8), the edges in Go.
func transposeInto(dst []float32, ldd int, src []float32, lds int, rows, cols int) {
	if rows <= 0 || cols <= 0 {
		return
	}
	_ = src[(rows-1)*lds+cols-1] // the last element read
	_ = dst[(cols-1)*ldd+rows-1] // the last element written
	r8, c8 := rows-rows%8, cols-cols%8
	for i := 0; i < r8; i += 8 {
		for j := 0; j < c8; j += 8 {
			transpose8(&dst[j*ldd+i], ldd, &src[i*lds+j], lds)
		}
	}
	for i := 0; i < rows; i++ {
		lo := c8
		if i >= r8 {
			lo = 0
		}
		for j := lo; j < cols; j++ {
			dst[j*ldd+i] = src[i*lds+j]
		}
	}
}
