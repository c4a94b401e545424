//go:build !purego

#include "textflag.h"
#include "sgemm_amd64.h"

// The AVX2 and FMA3 kernels, eight elements an instruction in the 16 YMM
// registers. The shapes they share with the AVX-512 ones are the macros of
// sgemm_amd64.h.

// ZERO_Y0_Y7 clears the accumulators Y0-Y7.
#define ZERO_Y0_Y7 \
	VXORPS Y0, Y0, Y0 \
	VXORPS Y1, Y1, Y1 \
	VXORPS Y2, Y2, Y2 \
	VXORPS Y3, Y3, Y3 \
	VXORPS Y4, Y4, Y4 \
	VXORPS Y5, Y5, Y5 \
	VXORPS Y6, Y6, Y6 \
	VXORPS Y7, Y7, Y7

// DOT3_COL, one row of B in sdot3x4's step: Y15 = its eight terms at
// (b)(SI*1); c0 += a0·Y15, c1 += a1·Y15 and c2 += a2·Y15 for A's three rows in
// Y12, Y13 and Y14.
#define DOT3_COL(b, c0, c1, c2) \
	VMOVUPS     (b)(SI*1), Y15 \
	VFMADD231PS Y15, Y12, c0  \
	VFMADD231PS Y15, Y13, c1  \
	VFMADD231PS Y15, Y14, c2

// DOT3_ROWS(ROW): ROW on sdot3x4's three rows of totals, alpha in X14.
#define DOT3_ROWS(ROW) \
	ROW(X0, X14, X15); ADDQ DX, DI \
	ROW(X4, X14, X15); ADDQ DX, DI \
	ROW(X8, X14, X15)

// TILE6_STEP, the A side of sgemmTile6x16's step: B's row in Y12, Y13;
// A's six elements broadcast in turn into Y14; row r accumulates in
// Y(2r), Y(2r+1).
#define TILE6_STEP \
	BCAST_FMA(0, Y14, Y12, Y13, Y0, Y1)   \
	BCAST_FMA(4, Y14, Y12, Y13, Y2, Y3)   \
	BCAST_FMA(8, Y14, Y12, Y13, Y4, Y5)   \
	BCAST_FMA(12, Y14, Y12, Y13, Y6, Y7)  \
	BCAST_FMA(16, Y14, Y12, Y13, Y8, Y9)  \
	BCAST_FMA(20, Y14, Y12, Y13, Y10, Y11)

// TILE6_ROWS(ROW): ROW on sgemmTile6x16's six rows, alpha in Y14, scratch
// Y12 and Y13.
#define TILE6_ROWS(ROW) \
	ROW(Y0, Y1, Y14, Y12, Y13, 32); ADDQ DX, DI \
	ROW(Y2, Y3, Y14, Y12, Y13, 32); ADDQ DX, DI \
	ROW(Y4, Y5, Y14, Y12, Y13, 32); ADDQ DX, DI \
	ROW(Y6, Y7, Y14, Y12, Y13, 32); ADDQ DX, DI \
	ROW(Y8, Y9, Y14, Y12, Y13, 32); ADDQ DX, DI \
	ROW(Y10, Y11, Y14, Y12, Y13, 32)

// func sdot3x4(k int, a *float32, lda int, b *float32, ldb int, c *float32, ldc int, alpha float32, acc bool)
// c[r*ldc+j] = alpha * sum over p < k of a[r*lda+p] * b[j*ldb+p] (plus
// c[r*ldc+j] itself when acc), for r < 3, j < 4: twelve dot products of
// three rows of A with four rows of B, eight elements an instruction; k is
// a multiple of 8 (the caller adds the rest). Row r, column j accumulates
// in Y(4r+j): twelve chains of FMAs, enough to keep both FMA units busy
// through their latency (two rows' eight chains ran at 72% of the tile
// kernel's rate with the data in the level-1 cache, 53 against 73
// Gflop/s on a Zen 3 core, 2026-12-01), and seven loads for twelve FMAs,
// all at one offset (SI) from their rows, so one add moves them on (the
// MLP's forward products 47 -> 50 and 45 -> 47 Gflop/s, medians of ten
// alternating runs, against one add a pointer).
// At the end three horizontal adds and a lane add leave each row's four
// sums in one XMM register.
TEXT ·sdot3x4(SB), NOSPLIT, $0-61
	MOVQ k+0(FP), CX
	SHRQ $3, CX
	MOVQ a+8(FP), AX
	MOVQ lda+16(FP), DX
	SHLQ $2, DX
	LEAQ (AX)(DX*1), R8
	LEAQ (R8)(DX*1), R12
	MOVQ b+24(FP), BX
	MOVQ ldb+32(FP), DX
	SHLQ $2, DX
	LEAQ (BX)(DX*1), R9
	LEAQ (R9)(DX*1), R10
	LEAQ (R10)(DX*1), R11
	ZERO_Y0_Y7
	VXORPS Y8, Y8, Y8
	VXORPS Y9, Y9, Y9
	VXORPS Y10, Y10, Y10
	VXORPS Y11, Y11, Y11
	XORQ   SI, SI
	TESTQ  CX, CX
	JEQ    d3sum

d3loop:
	VMOVUPS (AX)(SI*1), Y12
	VMOVUPS (R8)(SI*1), Y13
	VMOVUPS (R12)(SI*1), Y14
	DOT3_COL(BX, Y0, Y4, Y8)
	DOT3_COL(R9, Y1, Y5, Y9)
	DOT3_COL(R10, Y2, Y6, Y10)
	DOT3_COL(R11, Y3, Y7, Y11)
	ADDQ    $32, SI
	DECQ    CX
	JNE     d3loop

d3sum:
	HSUM4(Y0, Y1, Y2, Y3, X0, X1)
	HSUM4(Y4, Y5, Y6, Y7, X4, X5)
	HSUM4(Y8, Y9, Y10, Y11, X8, X9)
	VBROADCASTSS alpha+56(FP), X14
	MOVQ         c+40(FP), DI
	MOVQ         ldc+48(FP), DX
	SHLQ         $2, DX
	MOVBLZX      acc+60(FP), R8
	STORE(R8, DOT3_ROWS, DOT_ACC_ROW, DOT_SET_ROW)

// func sgemmTile6x16(k int, a, b *float32, ldb int, c *float32, ldc int, alpha float32, acc bool)
// c[r*ldc+j] = alpha * sum over p < k of a[p*6+r] * b[p*ldb+j] (plus
// c[r*ldc+j] itself when acc), for r < 6, j < 16: one 6x16 tile of C from a
// packed 6-row panel of A (k groups of 6) and 16 columns of B whose rows lie
// ldb apart (16 in a packed panel). Twelve accumulators; each step loads two
// vectors of B and broadcasts six elements of A. Without acc the tile is
// stored, C not read.
TEXT ·sgemmTile6x16(SB), NOSPLIT, $0-53
	TILE_ARGS
	ZERO_Y0_Y7
	VXORPS Y8, Y8, Y8
	VXORPS Y9, Y9, Y9
	VXORPS Y10, Y10, Y10
	VXORPS Y11, Y11, Y11
	TILE_LOOP(TILE6_STEP, 32, 24, Y12, Y13)
	VBROADCASTSS alpha+48(FP), Y14
	MOVBLZX      acc+52(FP), R10
	STORE(R10, TILE6_ROWS, TILE_ACC_ROW, TILE_SET_ROW)

// func copy16s(dst *float32, stride int, src *float32, n int)
// Copies n runs of 16 elements, contiguous at src, to dst, dst+stride,
// dst+2·stride, ... (stride in elements): packB's copy of a row of B into
// n packed panels of the 256-bit family, two loads and two stores a run
// where a 64-byte array assignment called memmove for each.
TEXT ·copy16s(SB), NOSPLIT, $0-32
	MOVQ  dst+0(FP), DI
	MOVQ  stride+8(FP), DX
	SHLQ  $2, DX
	MOVQ  src+16(FP), SI
	MOVQ  n+24(FP), CX
	TESTQ CX, CX
	JEQ   cdone

cloop:
	VMOVUPS (SI), Y0
	VMOVUPS 32(SI), Y1
	VMOVUPS Y0, (DI)
	VMOVUPS Y1, 32(DI)
	ADDQ    $64, SI
	ADDQ    DX, DI
	DECQ    CX
	JNE     cloop

cdone:
	VZEROUPPER
	RET

// TILE6R_STEP, the A side of sgemmTile6x16R's step: B's row in Y12, Y13;
// one element of each of A's six rows broadcast into Y14 and Y15 in turn.
#define TILE6R_STEP \
	BCAST_AT((AX), Y14, Y12, Y13, Y0, Y1)          \
	BCAST_AT((AX)(R8*1), Y15, Y12, Y13, Y2, Y3)    \
	BCAST_AT((AX)(R8*2), Y14, Y12, Y13, Y4, Y5)    \
	BCAST_AT((R12), Y15, Y12, Y13, Y6, Y7)         \
	BCAST_AT((R12)(R8*1), Y14, Y12, Y13, Y8, Y9)   \
	BCAST_AT((R12)(R8*2), Y15, Y12, Y13, Y10, Y11)

// func sgemmTile6x16R(k int, a *float32, lda int, b *float32, ldb int, c *float32, ldc int, alpha float32, acc bool)
// c[r*ldc+j] = alpha * sum over p < k of a[r*lda+p] * b[p*ldb+j] (plus
// c[r*ldc+j] itself when acc), for r < 6, j < 16: sgemmTile6x16 with A's
// six rows read where they lie, lda apart, instead of from a packed panel.
// Its rows are the six rows of a Linear layer's weight W, its B a packed
// panel of 16 rows of X transposed: a 6x16 tile of (X·Wᵀ)ᵀ, from W as it
// is (sgemmNTT). Each step broadcasts one element of each row, at one
// offset from AX (rows 0-2) and R12 (rows 3-5), so two adds move them on.
TEXT ·sgemmTile6x16R(SB), NOSPLIT, $0-61
	TILER_ARGS
	ZERO_Y0_Y7
	VXORPS Y8, Y8, Y8
	VXORPS Y9, Y9, Y9
	VXORPS Y10, Y10, Y10
	VXORPS Y11, Y11, Y11
	TILER_LOOP(TILE6R_STEP, 32, Y12, Y13)
	TILER_OUT(Y14)
	STORE(R10, TILE6_ROWS, TILE_ACC_ROW, TILE_SET_ROW)

// func transpose8(dst *float32, ldd int, src *float32, lds int)
// dst[j*ldd+i] = src[i*lds+j] for i, j < 8: one 8x8 block transposed in
// registers (unpacks, then shuffles, then lane swaps), for sgemmNTT's
// packing of Xᵀ and its copy of Cᵀ into C.
TEXT ·transpose8(SB), NOSPLIT, $0-32
	MOVQ dst+0(FP), DI
	MOVQ ldd+8(FP), DX
	SHLQ $2, DX
	MOVQ src+16(FP), SI
	MOVQ lds+24(FP), CX
	SHLQ $2, CX
	LEAQ (CX)(CX*2), R8
	LEAQ (SI)(CX*4), R9
	VMOVUPS (SI), Y0
	VMOVUPS (SI)(CX*1), Y1
	VMOVUPS (SI)(CX*2), Y2
	VMOVUPS (SI)(R8*1), Y3
	VMOVUPS (R9), Y4
	VMOVUPS (R9)(CX*1), Y5
	VMOVUPS (R9)(CX*2), Y6
	VMOVUPS (R9)(R8*1), Y7
	VUNPCKLPS Y1, Y0, Y8
	VUNPCKHPS Y1, Y0, Y9
	VUNPCKLPS Y3, Y2, Y10
	VUNPCKHPS Y3, Y2, Y11
	VUNPCKLPS Y5, Y4, Y12
	VUNPCKHPS Y5, Y4, Y13
	VUNPCKLPS Y7, Y6, Y14
	VUNPCKHPS Y7, Y6, Y15
	VSHUFPS   $0x44, Y10, Y8, Y0
	VSHUFPS   $0xEE, Y10, Y8, Y1
	VSHUFPS   $0x44, Y11, Y9, Y2
	VSHUFPS   $0xEE, Y11, Y9, Y3
	VSHUFPS   $0x44, Y14, Y12, Y4
	VSHUFPS   $0xEE, Y14, Y12, Y5
	VSHUFPS   $0x44, Y15, Y13, Y6
	VSHUFPS   $0xEE, Y15, Y13, Y7
	LEAQ      (DX)(DX*2), R8
	LEAQ      (DI)(DX*4), R9
	VPERM2F128 $0x20, Y4, Y0, Y8
	VPERM2F128 $0x20, Y5, Y1, Y9
	VPERM2F128 $0x20, Y6, Y2, Y10
	VPERM2F128 $0x20, Y7, Y3, Y11
	VPERM2F128 $0x31, Y4, Y0, Y12
	VPERM2F128 $0x31, Y5, Y1, Y13
	VPERM2F128 $0x31, Y6, Y2, Y14
	VPERM2F128 $0x31, Y7, Y3, Y15
	VMOVUPS Y8, (DI)
	VMOVUPS Y9, (DI)(DX*1)
	VMOVUPS Y10, (DI)(DX*2)
	VMOVUPS Y11, (DI)(R8*1)
	VMOVUPS Y12, (R9)
	VMOVUPS Y13, (R9)(DX*1)
	VMOVUPS Y14, (R9)(DX*2)
	VMOVUPS Y15, (R9)(R8*1)
	VZEROUPPER
	RET
