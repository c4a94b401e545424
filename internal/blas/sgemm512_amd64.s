//go:build !purego && !openblas

#include "textflag.h"

// The AVX-512 kernels: the same products as sgemm_amd64.s's, sixteen
// elements an instruction in the 32 ZMM registers.

// func sgemmTile8x32(k int, a, b *float32, ldb int, c *float32, ldc int, alpha float32, acc bool)
// c[r*ldc+j] = alpha * sum over p < k of a[p*8+r] * b[p*ldb+j] (plus
// c[r*ldc+j] itself when acc), for r < 8, j < 32: one 8x32 tile of C from a
// packed 8-row panel of A (k groups of 8) and 32 columns of B whose rows lie
// ldb apart (32 in a packed panel). Sixteen accumulators, Z0-Z15 (row r in
// Z(2r), Z(2r+1)); each step loads two vectors of B and broadcasts eight
// elements of A. Without acc the tile is stored, C not read.
TEXT ·sgemmTile8x32(SB), NOSPLIT, $0-53
	MOVQ k+0(FP), CX
	MOVQ a+8(FP), AX
	MOVQ b+16(FP), BX
	MOVQ ldb+24(FP), R9
	SHLQ $2, R9
	MOVQ c+32(FP), DI
	MOVQ ldc+40(FP), DX
	SHLQ $2, DX
	VPXORD Z0, Z0, Z0
	VPXORD Z1, Z1, Z1
	VPXORD Z2, Z2, Z2
	VPXORD Z3, Z3, Z3
	VPXORD Z4, Z4, Z4
	VPXORD Z5, Z5, Z5
	VPXORD Z6, Z6, Z6
	VPXORD Z7, Z7, Z7
	VPXORD Z8, Z8, Z8
	VPXORD Z9, Z9, Z9
	VPXORD Z10, Z10, Z10
	VPXORD Z11, Z11, Z11
	VPXORD Z12, Z12, Z12
	VPXORD Z13, Z13, Z13
	VPXORD Z14, Z14, Z14
	VPXORD Z15, Z15, Z15
	TESTQ CX, CX
	JEQ   t8store

t8loop:
	VMOVUPS (BX), Z16
	VMOVUPS 64(BX), Z17
	VBROADCASTSS 0(AX), Z18
	VFMADD231PS  Z16, Z18, Z0
	VFMADD231PS  Z17, Z18, Z1
	VBROADCASTSS 4(AX), Z19
	VFMADD231PS  Z16, Z19, Z2
	VFMADD231PS  Z17, Z19, Z3
	VBROADCASTSS 8(AX), Z20
	VFMADD231PS  Z16, Z20, Z4
	VFMADD231PS  Z17, Z20, Z5
	VBROADCASTSS 12(AX), Z21
	VFMADD231PS  Z16, Z21, Z6
	VFMADD231PS  Z17, Z21, Z7
	VBROADCASTSS 16(AX), Z22
	VFMADD231PS  Z16, Z22, Z8
	VFMADD231PS  Z17, Z22, Z9
	VBROADCASTSS 20(AX), Z23
	VFMADD231PS  Z16, Z23, Z10
	VFMADD231PS  Z17, Z23, Z11
	VBROADCASTSS 24(AX), Z24
	VFMADD231PS  Z16, Z24, Z12
	VFMADD231PS  Z17, Z24, Z13
	VBROADCASTSS 28(AX), Z25
	VFMADD231PS  Z16, Z25, Z14
	VFMADD231PS  Z17, Z25, Z15
	ADDQ         $32, AX
	ADDQ         R9, BX
	DECQ         CX
	JNE          t8loop

t8store:
	VBROADCASTSS alpha+48(FP), Z18
	MOVBLZX      acc+52(FP), R10
	TESTQ        R10, R10
	JEQ          t8set
	VMOVUPS      (DI), Z16
	VMOVUPS      64(DI), Z17
	VFMADD231PS  Z0, Z18, Z16
	VFMADD231PS  Z1, Z18, Z17
	VMOVUPS      Z16, (DI)
	VMOVUPS      Z17, 64(DI)
	ADDQ         DX, DI
	VMOVUPS      (DI), Z16
	VMOVUPS      64(DI), Z17
	VFMADD231PS  Z2, Z18, Z16
	VFMADD231PS  Z3, Z18, Z17
	VMOVUPS      Z16, (DI)
	VMOVUPS      Z17, 64(DI)
	ADDQ         DX, DI
	VMOVUPS      (DI), Z16
	VMOVUPS      64(DI), Z17
	VFMADD231PS  Z4, Z18, Z16
	VFMADD231PS  Z5, Z18, Z17
	VMOVUPS      Z16, (DI)
	VMOVUPS      Z17, 64(DI)
	ADDQ         DX, DI
	VMOVUPS      (DI), Z16
	VMOVUPS      64(DI), Z17
	VFMADD231PS  Z6, Z18, Z16
	VFMADD231PS  Z7, Z18, Z17
	VMOVUPS      Z16, (DI)
	VMOVUPS      Z17, 64(DI)
	ADDQ         DX, DI
	VMOVUPS      (DI), Z16
	VMOVUPS      64(DI), Z17
	VFMADD231PS  Z8, Z18, Z16
	VFMADD231PS  Z9, Z18, Z17
	VMOVUPS      Z16, (DI)
	VMOVUPS      Z17, 64(DI)
	ADDQ         DX, DI
	VMOVUPS      (DI), Z16
	VMOVUPS      64(DI), Z17
	VFMADD231PS  Z10, Z18, Z16
	VFMADD231PS  Z11, Z18, Z17
	VMOVUPS      Z16, (DI)
	VMOVUPS      Z17, 64(DI)
	ADDQ         DX, DI
	VMOVUPS      (DI), Z16
	VMOVUPS      64(DI), Z17
	VFMADD231PS  Z12, Z18, Z16
	VFMADD231PS  Z13, Z18, Z17
	VMOVUPS      Z16, (DI)
	VMOVUPS      Z17, 64(DI)
	ADDQ         DX, DI
	VMOVUPS      (DI), Z16
	VMOVUPS      64(DI), Z17
	VFMADD231PS  Z14, Z18, Z16
	VFMADD231PS  Z15, Z18, Z17
	VMOVUPS      Z16, (DI)
	VMOVUPS      Z17, 64(DI)
	VZEROUPPER
	RET

t8set:
	VMULPS       Z0, Z18, Z16
	VMULPS       Z1, Z18, Z17
	VMOVUPS      Z16, (DI)
	VMOVUPS      Z17, 64(DI)
	ADDQ         DX, DI
	VMULPS       Z2, Z18, Z16
	VMULPS       Z3, Z18, Z17
	VMOVUPS      Z16, (DI)
	VMOVUPS      Z17, 64(DI)
	ADDQ         DX, DI
	VMULPS       Z4, Z18, Z16
	VMULPS       Z5, Z18, Z17
	VMOVUPS      Z16, (DI)
	VMOVUPS      Z17, 64(DI)
	ADDQ         DX, DI
	VMULPS       Z6, Z18, Z16
	VMULPS       Z7, Z18, Z17
	VMOVUPS      Z16, (DI)
	VMOVUPS      Z17, 64(DI)
	ADDQ         DX, DI
	VMULPS       Z8, Z18, Z16
	VMULPS       Z9, Z18, Z17
	VMOVUPS      Z16, (DI)
	VMOVUPS      Z17, 64(DI)
	ADDQ         DX, DI
	VMULPS       Z10, Z18, Z16
	VMULPS       Z11, Z18, Z17
	VMOVUPS      Z16, (DI)
	VMOVUPS      Z17, 64(DI)
	ADDQ         DX, DI
	VMULPS       Z12, Z18, Z16
	VMULPS       Z13, Z18, Z17
	VMOVUPS      Z16, (DI)
	VMOVUPS      Z17, 64(DI)
	ADDQ         DX, DI
	VMULPS       Z14, Z18, Z16
	VMULPS       Z15, Z18, Z17
	VMOVUPS      Z16, (DI)
	VMOVUPS      Z17, 64(DI)
	VZEROUPPER
	RET

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
	VPXORD Z0, Z0, Z0
	VPXORD Z1, Z1, Z1
	VPXORD Z2, Z2, Z2
	VPXORD Z3, Z3, Z3
	VPXORD Z4, Z4, Z4
	VPXORD Z5, Z5, Z5
	VPXORD Z6, Z6, Z6
	VPXORD Z7, Z7, Z7
	VPXORD Z8, Z8, Z8
	VPXORD Z9, Z9, Z9
	VPXORD Z10, Z10, Z10
	VPXORD Z11, Z11, Z11
	VPXORD Z12, Z12, Z12
	VPXORD Z13, Z13, Z13
	VPXORD Z14, Z14, Z14
	VPXORD Z15, Z15, Z15
	XORQ SI, SI
	TESTQ CX, CX
	JEQ   d4sum

d4loop:
	VMOVUPS     (AX)(SI*1), Z16
	VMOVUPS     (R8)(SI*1), Z17
	VMOVUPS     (R9)(SI*1), Z18
	VMOVUPS     (R10)(SI*1), Z19
	VMOVUPS     (BX)(SI*1), Z20
	VFMADD231PS Z20, Z16, Z0
	VFMADD231PS Z20, Z17, Z4
	VFMADD231PS Z20, Z18, Z8
	VFMADD231PS Z20, Z19, Z12
	VMOVUPS     (R11)(SI*1), Z21
	VFMADD231PS Z21, Z16, Z1
	VFMADD231PS Z21, Z17, Z5
	VFMADD231PS Z21, Z18, Z9
	VFMADD231PS Z21, Z19, Z13
	VMOVUPS     (R12)(SI*1), Z22
	VFMADD231PS Z22, Z16, Z2
	VFMADD231PS Z22, Z17, Z6
	VFMADD231PS Z22, Z18, Z10
	VFMADD231PS Z22, Z19, Z14
	VMOVUPS     (R13)(SI*1), Z23
	VFMADD231PS Z23, Z16, Z3
	VFMADD231PS Z23, Z17, Z7
	VFMADD231PS Z23, Z18, Z11
	VFMADD231PS Z23, Z19, Z15
	ADDQ        $64, SI
	CMPQ        SI, CX
	JLT         d4loop

d4sum:
	VEXTRACTF64X4 $1, Z0, Y16
	VADDPS       Y16, Y0, Y0
	VEXTRACTF64X4 $1, Z1, Y17
	VADDPS       Y17, Y1, Y1
	VEXTRACTF64X4 $1, Z2, Y18
	VADDPS       Y18, Y2, Y2
	VEXTRACTF64X4 $1, Z3, Y19
	VADDPS       Y19, Y3, Y3
	VHADDPS      Y1, Y0, Y0
	VHADDPS      Y3, Y2, Y2
	VHADDPS      Y2, Y0, Y0
	VEXTRACTF128 $1, Y0, X1
	VADDPS       X1, X0, X0
	VEXTRACTF64X4 $1, Z4, Y16
	VADDPS       Y16, Y4, Y4
	VEXTRACTF64X4 $1, Z5, Y17
	VADDPS       Y17, Y5, Y5
	VEXTRACTF64X4 $1, Z6, Y18
	VADDPS       Y18, Y6, Y6
	VEXTRACTF64X4 $1, Z7, Y19
	VADDPS       Y19, Y7, Y7
	VHADDPS      Y5, Y4, Y4
	VHADDPS      Y7, Y6, Y6
	VHADDPS      Y6, Y4, Y4
	VEXTRACTF128 $1, Y4, X5
	VADDPS       X5, X4, X4
	VEXTRACTF64X4 $1, Z8, Y16
	VADDPS       Y16, Y8, Y8
	VEXTRACTF64X4 $1, Z9, Y17
	VADDPS       Y17, Y9, Y9
	VEXTRACTF64X4 $1, Z10, Y18
	VADDPS       Y18, Y10, Y10
	VEXTRACTF64X4 $1, Z11, Y19
	VADDPS       Y19, Y11, Y11
	VHADDPS      Y9, Y8, Y8
	VHADDPS      Y11, Y10, Y10
	VHADDPS      Y10, Y8, Y8
	VEXTRACTF128 $1, Y8, X9
	VADDPS       X9, X8, X8
	VEXTRACTF64X4 $1, Z12, Y16
	VADDPS       Y16, Y12, Y12
	VEXTRACTF64X4 $1, Z13, Y17
	VADDPS       Y17, Y13, Y13
	VEXTRACTF64X4 $1, Z14, Y18
	VADDPS       Y18, Y14, Y14
	VEXTRACTF64X4 $1, Z15, Y19
	VADDPS       Y19, Y15, Y15
	VHADDPS      Y13, Y12, Y12
	VHADDPS      Y15, Y14, Y14
	VHADDPS      Y14, Y12, Y12
	VEXTRACTF128 $1, Y12, X13
	VADDPS       X13, X12, X12
	VBROADCASTSS alpha+56(FP), X14
	MOVQ         c+40(FP), DI
	MOVQ         ldc+48(FP), DX
	SHLQ         $2, DX
	MOVBLZX      acc+60(FP), R8
	TESTQ        R8, R8
	JEQ          d4set
	VMOVUPS      (DI), X1
	VFMADD231PS  X0, X14, X1
	VMOVUPS      X1, (DI)
	ADDQ         DX, DI
	VMOVUPS      (DI), X1
	VFMADD231PS  X4, X14, X1
	VMOVUPS      X1, (DI)
	ADDQ         DX, DI
	VMOVUPS      (DI), X1
	VFMADD231PS  X8, X14, X1
	VMOVUPS      X1, (DI)
	ADDQ         DX, DI
	VMOVUPS      (DI), X1
	VFMADD231PS  X12, X14, X1
	VMOVUPS      X1, (DI)
	VZEROUPPER
	RET

d4set:
	VMULPS       X0, X14, X1
	VMOVUPS      X1, (DI)
	ADDQ         DX, DI
	VMULPS       X4, X14, X1
	VMOVUPS      X1, (DI)
	ADDQ         DX, DI
	VMULPS       X8, X14, X1
	VMOVUPS      X1, (DI)
	ADDQ         DX, DI
	VMULPS       X12, X14, X1
	VMOVUPS      X1, (DI)
	VZEROUPPER
	RET
