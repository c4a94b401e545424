//go:build !purego

#include "textflag.h"
#include "sgemm_amd64.h"

// The AVX-512 kernels: the same products as sgemm_amd64.s's, sixteen
// elements an instruction in the 32 ZMM registers.

// ZERO_Z0_Z15 clears the sixteen accumulators.
#define ZERO_Z0_Z15 \
	VPXORD Z0, Z0, Z0 \
	VPXORD Z1, Z1, Z1 \
	VPXORD Z2, Z2, Z2 \
	VPXORD Z3, Z3, Z3 \
	VPXORD Z4, Z4, Z4 \
	VPXORD Z5, Z5, Z5 \
	VPXORD Z6, Z6, Z6 \
	VPXORD Z7, Z7, Z7 \
	VPXORD Z8, Z8, Z8 \
	VPXORD Z9, Z9, Z9 \
	VPXORD Z10, Z10, Z10 \
	VPXORD Z11, Z11, Z11 \
	VPXORD Z12, Z12, Z12 \
	VPXORD Z13, Z13, Z13 \
	VPXORD Z14, Z14, Z14 \
	VPXORD Z15, Z15, Z15

// TILE8_STEP, the A side of sgemmTile8x32's step: B's row in Z16, Z17;
// A's eight elements broadcast into Z18-Z25; row r accumulates in Z(2r),
// Z(2r+1).
#define TILE8_STEP \
	BCAST_FMA(0, Z18, Z16, Z17, Z0, Z1)    \
	BCAST_FMA(4, Z19, Z16, Z17, Z2, Z3)    \
	BCAST_FMA(8, Z20, Z16, Z17, Z4, Z5)    \
	BCAST_FMA(12, Z21, Z16, Z17, Z6, Z7)   \
	BCAST_FMA(16, Z22, Z16, Z17, Z8, Z9)   \
	BCAST_FMA(20, Z23, Z16, Z17, Z10, Z11) \
	BCAST_FMA(24, Z24, Z16, Z17, Z12, Z13) \
	BCAST_FMA(28, Z25, Z16, Z17, Z14, Z15)

// TILE8_ROWS(ROW): ROW on sgemmTile8x32's eight rows, alpha in Z18,
// scratch Z16 and Z17.
#define TILE8_ROWS(ROW) \
	ROW(Z0, Z1, Z18, Z16, Z17, 64); ADDQ DX, DI   \
	ROW(Z2, Z3, Z18, Z16, Z17, 64); ADDQ DX, DI   \
	ROW(Z4, Z5, Z18, Z16, Z17, 64); ADDQ DX, DI   \
	ROW(Z6, Z7, Z18, Z16, Z17, 64); ADDQ DX, DI   \
	ROW(Z8, Z9, Z18, Z16, Z17, 64); ADDQ DX, DI   \
	ROW(Z10, Z11, Z18, Z16, Z17, 64); ADDQ DX, DI \
	ROW(Z12, Z13, Z18, Z16, Z17, 64); ADDQ DX, DI \
	ROW(Z14, Z15, Z18, Z16, Z17, 64)

// DOT4_COL, one row of B in sdot4x4's step: bj = its sixteen terms at
// (b)(SI*1); c_r += a_r·bj for A's four rows in Z16-Z19.
#define DOT4_COL(b, bj, c0, c1, c2, c3) \
	VMOVUPS     (b)(SI*1), bj \
	VFMADD231PS bj, Z16, c0   \
	VFMADD231PS bj, Z17, c1   \
	VFMADD231PS bj, Z18, c2   \
	VFMADD231PS bj, Z19, c3

// FOLD_ROW leaves one row's four totals in x0: its four 16-lane sums
// z0..z3 folded to 8 lanes in their low halves y0..y3 (Y16-Y19 scratch),
// then HSUM4.
#define FOLD_ROW(z0, z1, z2, z3, y0, y1, y2, y3, x0, x1) \
	VEXTRACTF64X4 $1, z0, Y16     \
	VADDPS        Y16, y0, y0     \
	VEXTRACTF64X4 $1, z1, Y17     \
	VADDPS        Y17, y1, y1     \
	VEXTRACTF64X4 $1, z2, Y18     \
	VADDPS        Y18, y2, y2     \
	VEXTRACTF64X4 $1, z3, Y19     \
	VADDPS        Y19, y3, y3     \
	HSUM4(y0, y1, y2, y3, x0, x1)

// DOT4_ROWS(ROW): ROW on sdot4x4's four rows of totals, alpha in X14.
#define DOT4_ROWS(ROW) \
	ROW(X0, X14, X1); ADDQ DX, DI  \
	ROW(X4, X14, X1); ADDQ DX, DI  \
	ROW(X8, X14, X1); ADDQ DX, DI  \
	ROW(X12, X14, X1)

// func sgemmTile8x32(k int, a, b *float32, ldb int, c *float32, ldc int, alpha float32, acc bool)
// c[r*ldc+j] = alpha * sum over p < k of a[p*8+r] * b[p*ldb+j] (plus
// c[r*ldc+j] itself when acc), for r < 8, j < 32: one 8x32 tile of C from a
// packed 8-row panel of A (k groups of 8) and 32 columns of B whose rows lie
// ldb apart (32 in a packed panel). Sixteen accumulators, Z0-Z15 (row r in
// Z(2r), Z(2r+1)); each step loads two vectors of B and broadcasts eight
// elements of A. Without acc the tile is stored, C not read.
TEXT ·sgemmTile8x32(SB), NOSPLIT, $0-53
	TILE_ARGS
	ZERO_Z0_Z15
	TILE_LOOP(TILE8_STEP, 64, 32, Z16, Z17)
	VBROADCASTSS alpha+48(FP), Z18
	MOVBLZX      acc+52(FP), R10
	STORE(R10, TILE8_ROWS, TILE_ACC_ROW, TILE_SET_ROW)

// func sgemmTile8x32Pack(k int, a, b *float32, ldb int, c *float32, ldc int, alpha float32, acc bool, pb *float32)
// sgemmTile8x32 on B's rows read in place (ldb apart), which it also
// copies, 32 elements a row, into the packed panel at pb for the row blocks
// that follow; it asks for B's row sixteen ahead while it computes, so the
// rows arrive from memory while the FMAs run instead of in a packing pass
// of their own.
TEXT ·sgemmTile8x32Pack(SB), NOSPLIT, $0-64
	TILE_ARGS
	MOVQ pb+56(FP), R10
	ZERO_Z0_Z15
	TESTQ CX, CX
	JEQ   pstore

ploop:
	VMOVUPS    (BX), Z16
	VMOVUPS    64(BX), Z17
	LEAQ       (BX)(R9*8), R11
	PREFETCHT0 (R11)(R9*8)
	PREFETCHT0 64(R11)(R9*8)
	VMOVUPS    Z16, (R10)
	VMOVUPS    Z17, 64(R10)
	TILE8_STEP
	ADDQ       $32, AX
	ADDQ       R9, BX
	ADDQ       $128, R10
	DECQ       CX
	JNE        ploop

pstore:
	VBROADCASTSS alpha+48(FP), Z18
	MOVBLZX      acc+52(FP), R10
	STORE(R10, TILE8_ROWS, TILE_ACC_ROW, TILE_SET_ROW)

// func sdot4x4(k int, a *float32, lda int, b *float32, ldb int, c *float32, ldc int, alpha float32, acc bool)
// c[r*ldc+j] = alpha * sum over p < k of a[r*lda+p] * b[j*ldb+p] (plus
// c[r*ldc+j] itself when acc), for r < 4, j < 4: sixteen dot products of
// four rows of A with four rows of B, sixteen elements an instruction; k is
// a multiple of 16 (the caller adds the rest). Row r, column j accumulates
// in Z(4r+j); at the end each row's four vectors fold to 256 bits, and
// three horizontal adds and a lane add leave its four sums in one XMM
// register.
TEXT ·sdot4x4(SB), NOSPLIT, $0-61
	MOVQ k+0(FP), CX
	SHRQ $4, CX
	SHLQ $6, CX // bytes of each row the loop reads
	MOVQ a+8(FP), AX
	MOVQ lda+16(FP), DX
	SHLQ $2, DX
	LEAQ (AX)(DX*1), R8
	LEAQ (R8)(DX*1), R9
	LEAQ (R9)(DX*1), R10
	MOVQ b+24(FP), BX
	MOVQ ldb+32(FP), DX
	SHLQ $2, DX
	LEAQ (BX)(DX*1), R11
	LEAQ (R11)(DX*1), R12
	LEAQ (R12)(DX*1), R13
	ZERO_Z0_Z15
	XORQ SI, SI
	TESTQ CX, CX
	JEQ   d4sum

d4loop:
	VMOVUPS (AX)(SI*1), Z16
	VMOVUPS (R8)(SI*1), Z17
	VMOVUPS (R9)(SI*1), Z18
	VMOVUPS (R10)(SI*1), Z19
	DOT4_COL(BX, Z20, Z0, Z4, Z8, Z12)
	DOT4_COL(R11, Z21, Z1, Z5, Z9, Z13)
	DOT4_COL(R12, Z22, Z2, Z6, Z10, Z14)
	DOT4_COL(R13, Z23, Z3, Z7, Z11, Z15)
	ADDQ    $64, SI
	CMPQ    SI, CX
	JLT     d4loop

d4sum:
	FOLD_ROW(Z0, Z1, Z2, Z3, Y0, Y1, Y2, Y3, X0, X1)
	FOLD_ROW(Z4, Z5, Z6, Z7, Y4, Y5, Y6, Y7, X4, X5)
	FOLD_ROW(Z8, Z9, Z10, Z11, Y8, Y9, Y10, Y11, X8, X9)
	FOLD_ROW(Z12, Z13, Z14, Z15, Y12, Y13, Y14, Y15, X12, X13)
	VBROADCASTSS alpha+56(FP), X14
	MOVQ         c+40(FP), DI
	MOVQ         ldc+48(FP), DX
	SHLQ         $2, DX
	MOVBLZX      acc+60(FP), R8
	STORE(R8, DOT4_ROWS, DOT_ACC_ROW, DOT_SET_ROW)

// TILE8R_STEP, the A side of sgemmTile8x32R's step: B's row in Z16, Z17;
// one element of each of A's eight rows broadcast into Z18-Z25; R13, on
// rows 6 and 7, moves on a term.
#define TILE8R_STEP \
	BCAST_AT((AX), Z18, Z16, Z17, Z0, Z1)          \
	BCAST_AT((AX)(R8*1), Z19, Z16, Z17, Z2, Z3)    \
	BCAST_AT((AX)(R8*2), Z20, Z16, Z17, Z4, Z5)    \
	BCAST_AT((R12), Z21, Z16, Z17, Z6, Z7)         \
	BCAST_AT((R12)(R8*1), Z22, Z16, Z17, Z8, Z9)   \
	BCAST_AT((R12)(R8*2), Z23, Z16, Z17, Z10, Z11) \
	BCAST_AT((R13), Z24, Z16, Z17, Z12, Z13)       \
	BCAST_AT((R13)(R8*1), Z25, Z16, Z17, Z14, Z15) \
	ADDQ $4, R13

// func sgemmTile8x32R(k int, a *float32, lda int, b *float32, ldb int, c *float32, ldc int, alpha float32, acc bool)
// c[r*ldc+j] = alpha * sum over p < k of a[r*lda+p] * b[p*ldb+j] (plus
// c[r*ldc+j] itself when acc), for r < 8, j < 32: sgemmTile8x32 with A's
// eight rows read where they lie, lda apart, instead of from a packed
// panel, as sgemmTile6x16R is sgemmTile6x16's: an 8x32 tile of (X·Wᵀ)ᵀ
// from eight rows of W as they are and a packed panel of 32 rows of X
// transposed (sgemmNTT). Each step broadcasts one element of each row, at
// one offset from AX (rows 0-2), R12 (rows 3-5) and R13 (rows 6-7), so
// three adds move them on.
TEXT ·sgemmTile8x32R(SB), NOSPLIT, $0-61
	TILER_ARGS
	LEAQ (R12)(R8*2), R13
	ADDQ R8, R13
	ZERO_Z0_Z15
	TILER_LOOP(TILE8R_STEP, 64, Z16, Z17)
	TILER_OUT(Z18)
	STORE(R10, TILE8_ROWS, TILE_ACC_ROW, TILE_SET_ROW)
