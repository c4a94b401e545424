//go:build !purego && !openblas

#include "textflag.h"

// func sdot2x4(k int, a *float32, lda int, b *float32, ldb int, c *float32, ldc int, alpha float32, acc bool)
// c[r*ldc+j] = alpha * sum over p < k of a[r*lda+p] * b[j*ldb+p] (plus
// c[r*ldc+j] itself when acc), for r < 2, j < 4: eight dot products of two
// rows of A with four rows of B, eight elements an instruction; k is a
// multiple of 8 (the caller adds the rest). Row r, column j accumulates in
// Y(4r+j); at the end three horizontal adds and a lane add leave each
// row's four sums in one XMM register.
TEXT ·sdot2x4(SB), NOSPLIT, $0-61
	MOVQ k+0(FP), CX
	SHRQ $3, CX
	MOVQ a+8(FP), AX
	MOVQ lda+16(FP), DX
	SHLQ $2, DX
	LEAQ (AX)(DX*1), R8
	MOVQ b+24(FP), BX
	MOVQ ldb+32(FP), DX
	SHLQ $2, DX
	LEAQ (BX)(DX*1), R9
	LEAQ (R9)(DX*1), R10
	LEAQ (R10)(DX*1), R11
	VXORPS Y0, Y0, Y0
	VXORPS Y1, Y1, Y1
	VXORPS Y2, Y2, Y2
	VXORPS Y3, Y3, Y3
	VXORPS Y4, Y4, Y4
	VXORPS Y5, Y5, Y5
	VXORPS Y6, Y6, Y6
	VXORPS Y7, Y7, Y7
	TESTQ CX, CX
	JEQ   d2sum

d2loop:
	VMOVUPS     (AX), Y8
	VMOVUPS     (R8), Y9
	VMOVUPS     (BX), Y10
	VFMADD231PS Y10, Y8, Y0
	VFMADD231PS Y10, Y9, Y4
	VMOVUPS     (R9), Y11
	VFMADD231PS Y11, Y8, Y1
	VFMADD231PS Y11, Y9, Y5
	VMOVUPS     (R10), Y12
	VFMADD231PS Y12, Y8, Y2
	VFMADD231PS Y12, Y9, Y6
	VMOVUPS     (R11), Y13
	VFMADD231PS Y13, Y8, Y3
	VFMADD231PS Y13, Y9, Y7
	ADDQ        $32, AX
	ADDQ        $32, R8
	ADDQ        $32, BX
	ADDQ        $32, R9
	ADDQ        $32, R10
	ADDQ        $32, R11
	DECQ        CX
	JNE         d2loop

d2sum:
	VHADDPS      Y1, Y0, Y0
	VHADDPS      Y3, Y2, Y2
	VHADDPS      Y2, Y0, Y0
	VEXTRACTF128 $1, Y0, X1
	VADDPS       X1, X0, X0
	VHADDPS      Y5, Y4, Y4
	VHADDPS      Y7, Y6, Y6
	VHADDPS      Y6, Y4, Y4
	VEXTRACTF128 $1, Y4, X5
	VADDPS       X5, X4, X4
	VBROADCASTSS alpha+56(FP), X14
	MOVQ         c+40(FP), DI
	MOVQ         ldc+48(FP), DX
	SHLQ         $2, DX
	MOVBLZX      acc+60(FP), R8
	TESTQ        R8, R8
	JEQ          d2set
	VMOVUPS      (DI), X9
	VFMADD231PS  X0, X14, X9
	VMOVUPS      X9, (DI)
	ADDQ         DX, DI
	VMOVUPS      (DI), X9
	VFMADD231PS  X4, X14, X9
	VMOVUPS      X9, (DI)
	VZEROUPPER
	RET

d2set:
	VMULPS       X0, X14, X9
	VMOVUPS      X9, (DI)
	ADDQ         DX, DI
	VMULPS       X4, X14, X9
	VMOVUPS      X9, (DI)
	VZEROUPPER
	RET

// func sgemmTile6x16(k int, a, b *float32, ldb int, c *float32, ldc int, alpha float32, acc bool)
// c[r*ldc+j] = alpha * sum over p < k of a[p*6+r] * b[p*ldb+j] (plus
// c[r*ldc+j] itself when acc), for r < 6, j < 16: one 6x16 tile of C from a
// packed 6-row panel of A (k groups of 6) and 16 columns of B whose rows lie
// ldb apart (16 in a packed panel). Twelve accumulators; each step loads two
// vectors of B and broadcasts six elements of A. Without acc the tile is
// stored, C not read.
TEXT ·sgemmTile6x16(SB), NOSPLIT, $0-53
	MOVQ k+0(FP), CX
	MOVQ a+8(FP), AX
	MOVQ b+16(FP), BX
	MOVQ ldb+24(FP), R9
	SHLQ $2, R9
	MOVQ c+32(FP), DI
	MOVQ ldc+40(FP), DX
	SHLQ $2, DX
	VXORPS Y0, Y0, Y0
	VXORPS Y1, Y1, Y1
	VXORPS Y2, Y2, Y2
	VXORPS Y3, Y3, Y3
	VXORPS Y4, Y4, Y4
	VXORPS Y5, Y5, Y5
	VXORPS Y6, Y6, Y6
	VXORPS Y7, Y7, Y7
	VXORPS Y8, Y8, Y8
	VXORPS Y9, Y9, Y9
	VXORPS Y10, Y10, Y10
	VXORPS Y11, Y11, Y11
	TESTQ CX, CX
	JEQ   t6store

t6loop:
	VMOVUPS      (BX), Y12
	VMOVUPS      32(BX), Y13
	VBROADCASTSS (AX), Y14
	VFMADD231PS  Y12, Y14, Y0
	VFMADD231PS  Y13, Y14, Y1
	VBROADCASTSS 4(AX), Y14
	VFMADD231PS  Y12, Y14, Y2
	VFMADD231PS  Y13, Y14, Y3
	VBROADCASTSS 8(AX), Y14
	VFMADD231PS  Y12, Y14, Y4
	VFMADD231PS  Y13, Y14, Y5
	VBROADCASTSS 12(AX), Y14
	VFMADD231PS  Y12, Y14, Y6
	VFMADD231PS  Y13, Y14, Y7
	VBROADCASTSS 16(AX), Y14
	VFMADD231PS  Y12, Y14, Y8
	VFMADD231PS  Y13, Y14, Y9
	VBROADCASTSS 20(AX), Y14
	VFMADD231PS  Y12, Y14, Y10
	VFMADD231PS  Y13, Y14, Y11
	ADDQ         $24, AX
	ADDQ         R9, BX
	DECQ         CX
	JNE          t6loop

t6store:
	VBROADCASTSS alpha+48(FP), Y14
	MOVBLZX      acc+52(FP), R10
	TESTQ        R10, R10
	JEQ          t6set
	VMOVUPS      (DI), Y12
	VMOVUPS      32(DI), Y13
	VFMADD231PS  Y0, Y14, Y12
	VFMADD231PS  Y1, Y14, Y13
	VMOVUPS      Y12, (DI)
	VMOVUPS      Y13, 32(DI)
	ADDQ         DX, DI
	VMOVUPS      (DI), Y12
	VMOVUPS      32(DI), Y13
	VFMADD231PS  Y2, Y14, Y12
	VFMADD231PS  Y3, Y14, Y13
	VMOVUPS      Y12, (DI)
	VMOVUPS      Y13, 32(DI)
	ADDQ         DX, DI
	VMOVUPS      (DI), Y12
	VMOVUPS      32(DI), Y13
	VFMADD231PS  Y4, Y14, Y12
	VFMADD231PS  Y5, Y14, Y13
	VMOVUPS      Y12, (DI)
	VMOVUPS      Y13, 32(DI)
	ADDQ         DX, DI
	VMOVUPS      (DI), Y12
	VMOVUPS      32(DI), Y13
	VFMADD231PS  Y6, Y14, Y12
	VFMADD231PS  Y7, Y14, Y13
	VMOVUPS      Y12, (DI)
	VMOVUPS      Y13, 32(DI)
	ADDQ         DX, DI
	VMOVUPS      (DI), Y12
	VMOVUPS      32(DI), Y13
	VFMADD231PS  Y8, Y14, Y12
	VFMADD231PS  Y9, Y14, Y13
	VMOVUPS      Y12, (DI)
	VMOVUPS      Y13, 32(DI)
	ADDQ         DX, DI
	VMOVUPS      (DI), Y12
	VMOVUPS      32(DI), Y13
	VFMADD231PS  Y10, Y14, Y12
	VFMADD231PS  Y11, Y14, Y13
	VMOVUPS      Y12, (DI)
	VMOVUPS      Y13, 32(DI)
	VZEROUPPER
	RET

t6set:
	VMULPS       Y0, Y14, Y12
	VMULPS       Y1, Y14, Y13
	VMOVUPS      Y12, (DI)
	VMOVUPS      Y13, 32(DI)
	ADDQ         DX, DI
	VMULPS       Y2, Y14, Y12
	VMULPS       Y3, Y14, Y13
	VMOVUPS      Y12, (DI)
	VMOVUPS      Y13, 32(DI)
	ADDQ         DX, DI
	VMULPS       Y4, Y14, Y12
	VMULPS       Y5, Y14, Y13
	VMOVUPS      Y12, (DI)
	VMOVUPS      Y13, 32(DI)
	ADDQ         DX, DI
	VMULPS       Y6, Y14, Y12
	VMULPS       Y7, Y14, Y13
	VMOVUPS      Y12, (DI)
	VMOVUPS      Y13, 32(DI)
	ADDQ         DX, DI
	VMULPS       Y8, Y14, Y12
	VMULPS       Y9, Y14, Y13
	VMOVUPS      Y12, (DI)
	VMOVUPS      Y13, 32(DI)
	ADDQ         DX, DI
	VMULPS       Y10, Y14, Y12
	VMULPS       Y11, Y14, Y13
	VMOVUPS      Y12, (DI)
	VMOVUPS      Y13, 32(DI)
	VZEROUPPER
	RET
