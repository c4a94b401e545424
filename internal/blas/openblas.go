//go:build openblas

package blas

/*
#cgo LDFLAGS: -lopenblas
#include <stdlib.h>
#include <string.h>
#include <cblas.h>
void openblas_set_num_threads(int num_threads);
char *openblas_get_corename(void);
void gotoblas_dynamic_init(void);
void gotoblas_dynamic_quit(void);

// tandem_set_coretype re-selects OpenBLAS's kernels as OPENBLAS_CORETYPE=name
// would have at load time.
static void tandem_set_coretype(const char *name) {
	setenv("OPENBLAS_CORETYPE", name, 1);
	gotoblas_dynamic_quit();
	gotoblas_dynamic_init();
	unsetenv("OPENBLAS_CORETYPE");
}
*/
import "C"

import (
	"os"
	"unsafe"

	gblas "gonum.org/v1/gonum/blas"
	G "gorgonia.org/gorgonia"
	"gorgonia.org/tensor"

	"github.com/tandemml/tandem/internal/blas/sgemm"
)

// Name names the BLAS compiled into this binary.
const Name = "openblas"

// ntRows and ntCols: the smallest A·Bᵀ (rows of C, columns of C) that
// Sgemm computes in package sgemm's kernels rather than OpenBLAS's.
const (
	ntRows = 64
	ntCols = 128
	// tileTerms: the fewest terms from which A·B and Aᵀ·B of at least
	// ntRows×ntCols go to package sgemm's tile kernels.
	tileTerms = 64
)

// Core names the kernel family OpenBLAS runs (for benchmark reports), and
// package sgemm's, with the products it computes (see Sgemm).
func Core() string {
	core := C.GoString(C.openblas_get_corename())
	switch fc := sgemm.Core(); {
	case sgemm.Wide():
		core += ", large A·Bᵀ, Aᵀ·B and A·B in " + fc
	case fc != "":
		core += ", large A·Bᵀ and Aᵀ·B in " + fc
	}
	return core
}

// openBLAS overrides gonum's GEMM and GEMV with OpenBLAS's and keeps gonum
// for everything else.
type openBLAS struct{ pure }

var impl Implementation = openBLAS{}

func init() {
	fixCoreType()
	C.openblas_set_num_threads(1)
	G.Use(impl)
	tensor.Use(impl)
}

// Default returns the BLAS this binary uses.
func Default() Implementation { return impl }

func trans(t gblas.Transpose) C.enum_CBLAS_TRANSPOSE {
	if t == gblas.NoTrans {
		return C.CblasNoTrans
	}
	return C.CblasTrans
}

// empty reports whether a product has nothing to compute, so that no
// pointer to an empty slice is taken.
func empty(m, n int) bool { return m == 0 || n == 0 }

// Sgemm is OpenBLAS's, except for a Linear layer's large products, which
// package sgemm's kernels compute faster: A·Bᵀ (the forward pass) of at
// least ntRows×ntCols, and Aᵀ·B (the weight gradient) of at least
// ntRows×ntCols over tileTerms terms; with the 512-bit family A·B (the
// input gradient) of that size too. OpenBLAS computes the smaller ones,
// the transposed forms and, with the 256-bit family, A·B.
//
// Measured on one core, Gflop/s, Tandem's against OpenBLAS's:
//
//   - a Xeon with AVX-512 (SkylakeX kernels), 2026-11-24: A·Bᵀ 64×1024
//     over 784 terms 131/107, 64×1024×1024 135/105, 64×128×1568 147/99,
//     64×256×256 129/103, 128×1024×1024 137/120; but 64×10×1024 89/112,
//     32×400×248 41/77, 16×25×892 58/81 (a CNN's weight gradients),
//     64×10×128 57/92. 2026-11-25, once the tile kernels packed B while
//     computing (best of 50, twice): Aᵀ·B 1024×1024 over 64 terms
//     154/131, 1024×784×64 147/132, A·B 64×1024×1024 143/119; but A·B
//     over 10 terms (64×1024×10) 85/115 and Aᵀ·B with 10 rows
//     (10×1024×64) 46/134.
//   - an AMD EPYC (Zen 3, AVX2, Zen kernels), 2026-12-01, medians of ten
//     alternating runs of BenchmarkMLPProducts: A·Bᵀ 64×1024×784 55.5/41.2,
//     Aᵀ·B 1024×1024×64 56.7/52.1 and 1024×784×64 69.3/63.8; but A·B
//     64×1024×1024 42.5/59.3.
func (openBLAS) Sgemm(tA, tB gblas.Transpose, m, n, k int, alpha float32, a []float32, lda int, b []float32, ldb int, beta float32, c []float32, ldc int) {
	if tA == gblas.NoTrans && tB == gblas.Trans && m >= ntRows && n >= ntCols && sgemm.Gemm(false, true, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc) {
		return
	}
	if tB == gblas.NoTrans && (tA == gblas.Trans || sgemm.Wide()) && m >= ntRows && n >= ntCols && k >= tileTerms &&
		sgemm.GemmTiles(tA == gblas.Trans, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc) {
		return
	}
	if empty(m, n) || k == 0 || len(a) == 0 || len(b) == 0 {
		pure{}.Sgemm(tA, tB, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc)
		return
	}
	cblasSgemm(tA, tB, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc)
}

// cblasSgemm is OpenBLAS's sgemm itself, the operands not empty.
func cblasSgemm(tA, tB gblas.Transpose, m, n, k int, alpha float32, a []float32, lda int, b []float32, ldb int, beta float32, c []float32, ldc int) {
	C.cblas_sgemm(C.CblasRowMajor, trans(tA), trans(tB), C.blasint(m), C.blasint(n), C.blasint(k),
		C.float(alpha), (*C.float)(unsafe.Pointer(&a[0])), C.blasint(lda),
		(*C.float)(unsafe.Pointer(&b[0])), C.blasint(ldb),
		C.float(beta), (*C.float)(unsafe.Pointer(&c[0])), C.blasint(ldc))
}

func (openBLAS) Dgemm(tA, tB gblas.Transpose, m, n, k int, alpha float64, a []float64, lda int, b []float64, ldb int, beta float64, c []float64, ldc int) {
	if empty(m, n) || k == 0 || len(a) == 0 || len(b) == 0 {
		pure{}.Dgemm(tA, tB, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc)
		return
	}
	C.cblas_dgemm(C.CblasRowMajor, trans(tA), trans(tB), C.blasint(m), C.blasint(n), C.blasint(k),
		C.double(alpha), (*C.double)(unsafe.Pointer(&a[0])), C.blasint(lda),
		(*C.double)(unsafe.Pointer(&b[0])), C.blasint(ldb),
		C.double(beta), (*C.double)(unsafe.Pointer(&c[0])), C.blasint(ldc))
}

func (openBLAS) Sgemv(tA gblas.Transpose, m, n int, alpha float32, a []float32, lda int, x []float32, incX int, beta float32, y []float32, incY int) {
	if empty(m, n) || len(x) == 0 || len(y) == 0 || incX <= 0 || incY <= 0 {
		pure{}.Sgemv(tA, m, n, alpha, a, lda, x, incX, beta, y, incY)
		return
	}
	C.cblas_sgemv(C.CblasRowMajor, trans(tA), C.blasint(m), C.blasint(n), C.float(alpha),
		(*C.float)(unsafe.Pointer(&a[0])), C.blasint(lda), (*C.float)(unsafe.Pointer(&x[0])), C.blasint(incX),
		C.float(beta), (*C.float)(unsafe.Pointer(&y[0])), C.blasint(incY))
}

func (openBLAS) Dgemv(tA gblas.Transpose, m, n int, alpha float64, a []float64, lda int, x []float64, incX int, beta float64, y []float64, incY int) {
	if empty(m, n) || len(x) == 0 || len(y) == 0 || incX <= 0 || incY <= 0 {
		pure{}.Dgemv(tA, m, n, alpha, a, lda, x, incX, beta, y, incY)
		return
	}
	C.cblas_dgemv(C.CblasRowMajor, trans(tA), C.blasint(m), C.blasint(n), C.double(alpha),
		(*C.double)(unsafe.Pointer(&a[0])), C.blasint(lda), (*C.double)(unsafe.Pointer(&x[0])), C.blasint(incX),
		C.double(beta), (*C.double)(unsafe.Pointer(&y[0])), C.blasint(incY))
}

// fixCoreType re-selects OpenBLAS's kernels when its detection fell short of
// what the processor runs (BetterOpenBLASCore); a core type the user forced
// with OPENBLAS_CORETYPE is left alone.
func fixCoreType() {
	if os.Getenv(CoreTypeEnv) != "" {
		return
	}
	if core := BetterOpenBLASCore(Core(), BestOpenBLASCore()); core != "" {
		name := C.CString(core)
		defer C.free(unsafe.Pointer(name))
		C.tandem_set_coretype(name)
	}
}
