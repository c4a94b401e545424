//go:build amd64 && !purego

package sgemm

import (
	"runtime"
	"sync"

	"github.com/tandemml/tandem/internal/cpufeat"
)

//go:noescape
func sgemmTile6x16(k int, a, b *float32, ldb int, c *float32, ldc int, alpha float32, acc bool)

//go:noescape
func sdot3x4(k int, a *float32, lda int, b *float32, ldb int, c *float32, ldc int, alpha float32, acc bool)

//go:noescape
func sgemmTile8x32(k int, a, b *float32, ldb int, c *float32, ldc int, alpha float32, acc bool)

//go:noescape
func sgemmTile8x32Pack(k int, a, b *float32, ldb int, c *float32, ldc int, alpha float32, acc bool, pb *float32)

//go:noescape
func copy16s(dst *float32, stride int, src *float32, n int)

//go:noescape
func sdot4x4(k int, a *float32, lda int, b *float32, ldb int, c *float32, ldc int, alpha float32, acc bool)

// kernels is one family of assembly kernels and the shapes they compute.
type kernels struct {
	name string
	wide bool // the 512-bit family
	// tile writes (acc: adds) alpha times the product of a packed
	// mr-row panel of A and a packed nr-column panel of B into an mr×nr
	// tile of C.
	mr, nr int
	// dot writes (acc: adds) alpha times the dr×dc dot products of dr
	// rows of A with dc rows of B over the first k terms, k a multiple of
	// dk, into a dr×dc block of C.
	dr, dc, dk int
}

// tile runs the family's tile kernel. (Direct calls, not function values,
// so that the buffers handed to them stay on the stack.)
func (kn *kernels) tile(k int, a, b *float32, ldb int, c *float32, ldc int, alpha float32, acc bool) {
	if kn.wide {
		sgemmTile8x32(k, a, b, ldb, c, ldc, alpha, acc)
	} else {
		sgemmTile6x16(k, a, b, ldb, c, ldc, alpha, acc)
	}
}

// dot runs the family's dot-product kernel.
func (kn *kernels) dot(k int, a *float32, lda int, b *float32, ldb int, c *float32, ldc int, alpha float32, acc bool) {
	if kn.wide {
		sdot4x4(k, a, lda, b, ldb, c, ldc, alpha, acc)
	} else {
		sdot3x4(k, a, lda, b, ldb, c, ldc, alpha, acc)
	}
}

// avx2 is the 256-bit family (AVX2 and FMA3): 6x16 tiles, 3x4 dots.
var avx2 = &kernels{name: "go-fma", mr: 6, nr: 16, dr: 3, dc: 4, dk: 8}

// avx512 is the 512-bit family (AVX-512 F and VL): 8x32 tiles, 4x4 dots
// sixteen terms at a time.
var avx512 = &kernels{name: "go-avx512", wide: true, mr: 8, nr: 32, dr: 4, dc: 4, dk: 16}

// best is the family the products use: the widest the processor and the
// operating system support (nil where neither).
var best = func() *kernels {
	switch {
	case cpufeat.AVX512 && cpufeat.FMA:
		return avx512
	case cpufeat.FMA:
		return avx2
	}
	return nil
}()

// Core names the family in use, "" for none.
func Core() string {
	if best == nil {
		return ""
	}
	return best.name
}

// fastFrom is the size (m·n·k) from which the tiled product pays for its
// packing; smaller products go to gonum.
const fastFrom = 1 << 12

// Gemm computes C = alpha·op(A)·op(B) + beta·C (op transposing where
// transA, transB say so) in the widest family the processor has and
// reports true. It reports false, C untouched, where there is no family,
// the product is too small to pay for the kernels (m·n·k < 4096), alpha is
// 0, or the arguments do not describe matrices that fit their slices: the
// caller then computes it otherwise (gonum, which reports bad arguments).
func Gemm(transA, transB bool, m, n, k int, alpha float32, a []float32, lda int, b []float32, ldb int, beta float32, c []float32, ldc int) bool {
	if !takes(transA, transB, m, n, k, alpha, len(a), lda, len(b), ldb, len(c), ldc) {
		return false
	}
	sgemmWith(best, transA, transB, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc)
	return true
}

// GemmTiles is Gemm for C = alpha·op(A)·B + beta·C (A transposed when
// transA) in the widest family's tile kernels, on the calling goroutine
// alone (as OpenBLAS runs, one thread a rank): false where Gemm would be.
func GemmTiles(transA bool, m, n, k int, alpha float32, a []float32, lda int, b []float32, ldb int, beta float32, c []float32, ldc int) bool {
	if !takes(transA, false, m, n, k, alpha, len(a), lda, len(b), ldb, len(c), ldc) {
		return false
	}
	if beta != 0 {
		scaleRows(m, n, beta, c, ldc)
	}
	sgemmTiles(best, 1, transA, false, m, n, k, alpha, a, lda, b, ldb, c, ldc, beta != 0)
	return true
}

// takes reports whether the kernels compute a product: a family runs, the
// product pays for it, alpha is not 0 and the arguments fit (gemmArgsOK).
func takes(transA, transB bool, m, n, k int, alpha float32, la, lda, lb, ldb, lc, ldc int) bool {
	return best != nil && m*n*k >= fastFrom && alpha != 0 && gemmArgsOK(transA, transB, m, n, k, la, lda, lb, ldb, lc, ldc)
}

// Wide reports whether the products run in the 512-bit family.
func Wide() bool { return best == avx512 }

// sgemmWith computes C = alpha·op(A)·op(B) + beta·C in the kernels kn,
// the arguments already checked, the tiled products on up to
// productThreads goroutines (threads.go). With beta 0 the products overwrite C (NaNs included, as
// BLAS does) rather than clearing it first.
func sgemmWith(kn *kernels, transA, transB bool, m, n, k int, alpha float32, a []float32, lda int, b []float32, ldb int, beta float32, c []float32, ldc int) {
	acc := beta != 0
	if acc {
		scaleRows(m, n, beta, c, ldc)
	}
	if !transA && transB {
		// A·Bᵀ: rows of A against rows of B, both contiguous. A batch of
		// rows goes through the tile kernel as (B·Aᵀ)ᵀ, other shapes
		// through dot products, nothing to pack.
		if useNTT(kn, m, n, k) {
			sgemmNTT(kn, m, n, k, alpha, a, lda, b, ldb, c, ldc, acc)
			return
		}
		sgemmNT(kn, m, n, k, alpha, a, lda, b, ldb, c, ldc, acc)
		return
	}
	sgemmTiles(kn, productThreads, transA, transB, m, n, k, alpha, a, lda, b, ldb, c, ldc, acc)
}

// scaleRows multiplies the m×n matrix C by beta, which is not 0 (with beta
// 0 the kernels write over C instead).
func scaleRows(m, n int, beta float32, c []float32, ldc int) {
	if beta == 1 {
		return
	}
	for i := 0; i < m; i++ {
		row := c[i*ldc : i*ldc+n]
		for j := range row {
			row[j] *= beta
		}
	}
}

// A·Bᵀ runs in passes over ntDepth terms of ntRows rows of B at a time:
// 32 KiB of B, which stay in the level-1 cache while every row block of A
// goes past them (two blocks of B's four rows per block of A's). Blocks of
// 32 rows, 128 KiB in the level-2 cache, fed the kernel half its loads from
// there and measured 5% slower on the MLP's products (2026-11-25, 64×1024
// over 784 and 1024 terms: 141 and 140 against 151 and 147 Gflop/s);
// shallower passes, 256 or 512 terms, slower still: each pass ends in the
// kernel's horizontal sums.
const (
	ntDepth = 1024
	ntRows  = 8
)

// sgemmNT writes (acc: adds) alpha·A·Bᵀ to C, A m×k and B n×k: dr×dc
// blocks of dot products in the vector kernel, which adds each pass's sums
// into C itself, and the last k%dk terms in Go. The rows (columns) left
// over by dr (dc) go through the kernel one at a time, handed to it with a
// leading dimension of 0 so that it repeats the one row, and a small
// buffer takes the sums, of which the first copy is kept.
func sgemmNT(kn *kernels, m, n, k int, alpha float32, a []float32, lda int, b []float32, ldb int, c []float32, ldc int, acc bool) {
	dr, dc := kn.dr, kn.dc
	kq := k - k%kn.dk
	var out [16]float32
	// edge computes the rows×cols block at (i, j) over terms k0..k1, one
	// of rows and cols being 1, and writes or adds it into C. To add, the
	// block's part of C goes into the buffer first and the kernel adds
	// into it, so that an edge rounds as the blocks do (one fused
	// multiply-add of the sums and alpha into C).
	edge := func(i, rows, j, cols, k0, k1 int, add bool) {
		la, lb := lda, ldb
		if rows == 1 {
			la = 0
		}
		if cols == 1 {
			lb = 0
		}
		for r := 0; r < rows; r++ {
			for cc := 0; cc < cols; cc++ {
				if add {
					out[r*dc+cc] = c[(i+r)*ldc+j+cc]
				} else {
					out[r*dc+cc] = 0
				}
			}
		}
		if k1 > k0 {
			kn.dot(k1-k0, &a[i*lda+k0], la, &b[j*ldb+k0], lb, &out[0], dc, alpha, add)
		}
		for r := 0; r < rows; r++ {
			copy(c[(i+r)*ldc+j:(i+r)*ldc+j+cols], out[r*dc:r*dc+cols])
		}
	}
	for k0 := 0; k0 == 0 || k0 < kq; k0 += ntDepth {
		k1 := min(k0+ntDepth, kq)
		add := acc || k0 > 0
		for jb := 0; jb < n; jb += ntRows {
			je := min(jb+ntRows, n)
			for i := 0; i < m; {
				rows := dr
				if i+dr > m {
					rows = 1
				}
				for j := jb; j < je; {
					cols := dc
					if j+dc > je {
						cols = 1
					}
					if rows == dr && cols == dc && k1 > k0 {
						kn.dot(k1-k0, &a[i*lda+k0], lda, &b[j*ldb+k0], ldb, &c[i*ldc+j], ldc, alpha, add)
					} else {
						edge(i, rows, j, cols, k0, k1, add)
					}
					j += cols
				}
				i += rows
			}
		}
	}
	if kq == k {
		return
	}
	// The last k%dk terms of every product.
	for i := 0; i < m; i++ {
		ar := a[i*lda+kq : i*lda+k]
		for j := 0; j < n; j++ {
			br := b[j*ldb+kq : j*ldb+k]
			var s float32
			for p, v := range ar {
				s += v * br[p]
			}
			c[i*ldc+j] += alpha * s
		}
	}
}

// gemmArgsOK checks the shapes as the reference BLAS does: sizes positive,
// leading dimensions and slice lengths large enough.
func gemmArgsOK(transA, transB bool, m, n, k, la, lda, lb, ldb, lc, ldc int) bool {
	if m <= 0 || n <= 0 || k <= 0 {
		return false
	}
	ar, ac := m, k
	if transA {
		ar, ac = k, m
	}
	br, bc := k, n
	if transB {
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

// sgemmTiles writes (acc: adds) alpha·op(A)·op(B) to C (row major): A is
// packed into panels of mr rows and B into panels of nr columns
// (zero-padded at the edges), and the tile kernel writes alpha times each
// mr×nr tile's sums into C, straight into it away from the edges; products
// of 2²¹ multiply-adds and more split their column blocks among up to maxW
// goroutines (and GOMAXPROCS). (Reading
// an untransposed B in place for every row block, rows 4 KiB apart, was
// slower than the copy; the 512-bit family makes the copy while it computes
// the first row block, sgemmTile8x32Pack, which took A·B 64×1024×1024 from
// 1.2 ms to 0.93 on one core, 2026-11-25.)
func sgemmTiles(kn *kernels, maxW int, transA, transB bool, m, n, k int, alpha float32, a []float32, lda int, b []float32, ldb int, c []float32, ldc int, acc bool) {
	mr, nr := kn.mr, kn.nr
	mp := (m + mr - 1) / mr
	pap := getPanel(mp * mr * k)
	defer panelPool.Put(pap)
	pa := *pap
	for ib := 0; ib < mp; ib++ {
		panel := pa[ib*mr*k : (ib+1)*mr*k]
		rows := min(mr, m-ib*mr)
		if transA {
			// op(A)'s rows are A's columns: copy k runs of rows elements,
			// whole runs as fixed-size moves (a copy call for each of a
			// weight gradient's 64×171 runs of six cost more than the
			// move).
			switch {
			case rows == 6 && mr == 6:
				for p := 0; p < k; p++ {
					i0 := p*lda + ib*6
					*(*[6]float32)(panel[p*6 : p*6+6]) = *(*[6]float32)(a[i0 : i0+6])
				}
				continue
			case rows == 8 && mr == 8:
				for p := 0; p < k; p++ {
					i0 := p*lda + ib*8
					*(*[8]float32)(panel[p*8 : p*8+8]) = *(*[8]float32)(a[i0 : i0+8])
				}
				continue
			}
			for p := 0; p < k; p++ {
				dst := panel[p*mr : p*mr+mr]
				i0 := p*lda + ib*mr
				copy(dst, a[i0:i0+rows])
				clear(dst[rows:])
			}
			continue
		}
		if mr == 8 && rows == 8 {
			packRows8(panel, a[ib*8*lda:], lda, k)
			continue
		}
		for r := 0; r < mr; r++ {
			if r >= rows {
				for p := 0; p < k; p++ {
					panel[p*mr+r] = 0
				}
				continue
			}
			i := ib*mr + r
			for p, v := range a[i*lda : i*lda+k] {
				panel[p*mr+r] = v
			}
		}
	}
	nb := (n + nr - 1) / nr
	workers := 1
	if m*n*k >= 1<<21 {
		workers = min(runtime.GOMAXPROCS(0), nb, maxW)
	}
	if workers <= 1 {
		sgemmColumns(kn, 0, nb, transB, m, n, k, alpha, pa, b, ldb, c, ldc, acc)
		return
	}
	inParallel(nb, workers, func(lo, hi int) {
		sgemmColumns(kn, lo, hi, transB, m, n, k, alpha, pa, b, ldb, c, ldc, acc)
	})
}

// inParallel runs run over 0..n-1 split into up to workers ranges of
// consecutive indices, each on a goroutine of its own (on the caller's
// alone for one worker), and returns when all are done.
func inParallel(n, workers int, run func(lo, hi int)) {
	if workers <= 1 {
		run(0, n)
		return
	}
	var wg sync.WaitGroup
	per := (n + workers - 1) / workers
	for lo := 0; lo < n; lo += per {
		wg.Add(1)
		go func(lo, hi int) {
			defer wg.Done()
			run(lo, hi)
		}(lo, min(lo+per, n))
	}
	wg.Wait()
}

// packRows8 packs eight rows of A, lda apart in a, k terms each, into an
// 8-row panel: the eight elements of each term side by side, written in
// order (a row at a time wrote the panel 32 bytes apart, one element each,
// at twice the time).
func packRows8(panel, a []float32, lda, k int) {
	r0, r1, r2, r3 := a[:k], a[lda:lda+k], a[2*lda:2*lda+k], a[3*lda:3*lda+k]
	r4, r5, r6, r7 := a[4*lda:4*lda+k], a[5*lda:5*lda+k], a[6*lda:6*lda+k], a[7*lda:7*lda+k]
	panel = panel[:8*k]
	for p := range r0 {
		d := (*[8]float32)(panel[8*p : 8*p+8])
		d[0], d[1], d[2], d[3] = r0[p], r1[p], r2[p], r3[p]
		d[4], d[5], d[6], d[7] = r4[p], r5[p], r6[p], r7[p]
	}
}

// tileDepth is how many terms of the product a packed panel of B holds:
// tileDepth×nr floats (32 KiB in the 512-bit family) that stay in the
// level-1 cache, with the A panel's tileDepth×mr, while every row block of
// A goes past them. Panels of all k terms (128 KiB for k 1024) stay in
// the level-2 cache only: A·B 64×1024×1024 took 0.99 to 1.02 ms with
// them, 0.93 with these (one core, 2026-11-25).
const tileDepth = 256

// sgemmColumns computes the tiles of the nr-column blocks lo..hi-1, in
// passes over tileDepth terms.
func sgemmColumns(kn *kernels, lo, hi int, transB bool, m, n, k int, alpha float32, pa, b []float32, ldb int, c []float32, ldc int, acc bool) {
	mr, nr := kn.mr, kn.nr
	kc := min(k, tileDepth)
	// The 256-bit family packs B for colGroup bytes of panels at a time
	// (packB reads each row of B once for all of them); the 512-bit family
	// packs an untransposed B one block at a time, inside its kernel.
	group := 1
	if !kn.wide {
		group = max(1, colGroup/(4*nr*kc))
	}
	pbp := getPanel(group * nr * kc)
	defer panelPool.Put(pbp)
	pb := *pbp
	var edgeBuf [8 * 32]float32
	edge := edgeBuf[:mr*nr]
	for g0 := lo; g0 < hi; g0 += group {
		g1 := min(g0+group, hi)
		for p0 := 0; p0 < k; p0 += kc {
			d := min(kc, k-p0)
			add := acc || p0 > 0
			j0 := g0 * nr
			inKernel := kn.wide && !transB && min(nr, n-j0) == nr && m >= mr
			if !inKernel {
				packB(pb, g0, g1, nr, transB, n, p0, d, b, ldb)
			}
			// tileAt computes the tile at row i of column block jb.
			tileAt := func(i, jb int) {
				j := jb * nr
				w := min(nr, n-j)
				panel, panelB := &pa[i*k+p0*mr], &pb[(jb-g0)*d*nr]
				if i+mr <= m && w == nr {
					kn.tile(d, panel, panelB, nr, &c[i*ldc+j], ldc, alpha, add)
					return
				}
				kn.tile(d, panel, panelB, nr, &edge[0], nr, alpha, false)
				addEdge(c[i*ldc+j:], ldc, edge, nr, min(mr, m-i), w, add)
			}
			if !kn.wide {
				// Along C's rows: each tile's rows continue the last
				// one's, so C is written (read, when adding) in runs
				// the caches fetch ahead, where going down a column
				// block took a new page for every row of a weight's
				// gradient.
				for i := 0; i < m; i += mr {
					for jb := g0; jb < g1; jb++ {
						tileAt(i, jb)
					}
				}
				continue
			}
			for jb := g0; jb < g1; jb++ {
				i := 0
				if inKernel {
					j := jb * nr
					sgemmTile8x32Pack(d, &pa[p0*mr], &b[p0*ldb+j], ldb, &c[j], ldc, alpha, add, &pb[(jb-g0)*d*nr])
					i = mr
				}
				for ; i < m; i += mr {
					tileAt(i, jb)
				}
			}
		}
	}
}

// colGroup is the size of the packed panels of B that the 256-bit family
// packs at once: packed one 64-byte block at a time, the rows of a Linear
// layer's weight 4 KiB apart, B's reads waited on memory (memmove at 18 to
// 22% of the MLP's step on a core with 512 KiB of level-2 cache,
// 2026-12-01); a group reads a kilobyte of each row in order. Half that
// level-2 cache.
const colGroup = 256 << 10

// packB packs terms p0..p0+d of op(B)'s columns in the nr-column blocks
// lo..hi-1 into pbs, one d×nr panel after the other, zero-padded past n.
// An untransposed B is read a row at a time, its rows being where its
// columns lie contiguous: reading a panel's columns down the rows instead,
// rows 4 KiB apart in a Linear layer's weight, waited on memory.
func packB(pbs []float32, lo, hi, nr int, transB bool, n, p0, d int, b []float32, ldb int) {
	if transB {
		for jb := lo; jb < hi; jb++ {
			pb := pbs[(jb-lo)*d*nr:]
			j := jb * nr
			w := min(nr, n-j)
			for jj := 0; jj < nr; jj++ {
				if jj >= w {
					for p := 0; p < d; p++ {
						pb[p*nr+jj] = 0
					}
					continue
				}
				row := (j + jj) * ldb
				for p, v := range b[row+p0 : row+p0+d] {
					pb[p*nr+jj] = v
				}
			}
		}
		return
	}
	full := min(hi, n/nr) // blocks with nr columns of B
	for p := 0; p < d; p++ {
		row := b[(p0+p)*ldb : (p0+p)*ldb+n]
		jb := lo
		// Whole blocks as fixed-size moves: a copy call for each of the
		// 256-bit family's 64-byte pieces was 18% of the MLP's training
		// step on a core without the 512-bit family (2026-12-01); its
		// blocks go through copy16s, one call a row, since the 64-byte
		// assignment still called memmove for each (A·B 64×1024×1024
		// 33.7 -> 41.1 Gflop/s, the MLP's eight products 39.3 -> 43.8,
		// medians of eight alternating runs on one Zen 3 core).
		switch nr {
		case 32:
			for ; jb < full; jb++ {
				o := (jb-lo)*d*nr + p*nr
				*(*[32]float32)(pbs[o : o+32]) = *(*[32]float32)(row[jb*32 : jb*32+32])
			}
		case 16:
			if jb < full {
				o := p * nr
				_ = pbs[(full-1-lo)*d*nr+o+15] // the last run copy16s writes
				copy16s(&pbs[o], d*nr, &row[jb*16], full-jb)
				jb = full
			}
		}
		for ; jb < hi; jb++ {
			j := jb * nr
			dst := pbs[(jb-lo)*d*nr+p*nr : (jb-lo)*d*nr+p*nr+nr]
			clear(dst[copy(dst, row[j:min(j+nr, n)]):])
		}
	}
}

// addEdge writes (add: adds) the rows×w corner of an edge tile, computed
// into edge with leading dimension nr, into C at c (leading dimension ldc).
func addEdge(c []float32, ldc int, edge []float32, nr, rows, w int, add bool) {
	for r := 0; r < rows; r++ {
		crow := c[r*ldc : r*ldc+w]
		src := edge[r*nr : r*nr+w]
		if add {
			for jj, v := range src {
				crow[jj] += v
			}
		} else {
			copy(crow, src)
		}
	}
}
