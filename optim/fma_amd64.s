//go:build !purego

#include "textflag.h"

// The float32 update kernels of SGD and Adam: eight elements an instruction,
// then one at a time for the tail. Weight decay, where a flag asks for it,
// adds wd·p to the gradient first with one more fused multiply-add (a flag,
// not wd == 0, because fma(0, p, g) is NaN for an infinite p).

// func sgdFMA32(p, g []float32, negLR, wd float32, hasWD bool)
// d = g, or fma(wd, p[i], g[i]); p[i] = fma(negLR, d, p[i]); len(g) >= len(p).
TEXT ·sgdFMA32(SB), NOSPLIT, $0-57
	MOVQ    p_base+0(FP), DI
	MOVQ    p_len+8(FP), CX
	MOVQ    g_base+24(FP), SI
	VBROADCASTSS negLR+48(FP), Y0
	VBROADCASTSS wd+52(FP), Y5
	MOVBLZX hasWD+56(FP), R9
	XORQ    AX, AX
	MOVQ    CX, DX
	ANDQ    $-8, DX

sgd8:
	CMPQ AX, DX
	JGE  sgd1
	VMOVUPS (DI)(AX*4), Y1
	VMOVUPS (SI)(AX*4), Y3
	TESTQ   R9, R9
	JZ      sgd8nowd
	VFMADD231PS Y1, Y5, Y3

sgd8nowd:
	VFMADD231PS Y3, Y0, Y1
	VMOVUPS     Y1, (DI)(AX*4)
	ADDQ        $8, AX
	JMP         sgd8

sgd1:
	CMPQ AX, CX
	JGE  sgddone
	VMOVSS (DI)(AX*4), X1
	VMOVSS (SI)(AX*4), X3
	TESTQ  R9, R9
	JZ     sgd1nowd
	VFMADD231SS X1, X5, X3

sgd1nowd:
	VFMADD231SS X3, X0, X1
	VMOVSS      X1, (DI)(AX*4)
	INCQ        AX
	JMP         sgd1

sgddone:
	VZEROUPPER
	RET

// func momentumFMA32(p, g, buf []float32, mom, damp, negLR, wd float32, hasWD bool)
// For i < len(p): d = g[i], or fma(wd, p[i], g[i]); b = fma(damp, d, buf[i]·mom);
// buf[i] = b; p[i] = fma(negLR, b, p[i]). len(g), len(buf) >= len(p).
TEXT ·momentumFMA32(SB), NOSPLIT, $0-89
	MOVQ    p_base+0(FP), DI
	MOVQ    p_len+8(FP), CX
	MOVQ    g_base+24(FP), SI
	MOVQ    buf_base+48(FP), BX
	VBROADCASTSS mom+72(FP), Y0
	VBROADCASTSS damp+76(FP), Y1
	VBROADCASTSS negLR+80(FP), Y2
	VBROADCASTSS wd+84(FP), Y5
	MOVBLZX hasWD+88(FP), R9
	XORQ    AX, AX
	MOVQ    CX, DX
	ANDQ    $-8, DX

mom8:
	CMPQ AX, DX
	JGE  mom1
	VMOVUPS (DI)(AX*4), Y4
	VMOVUPS (SI)(AX*4), Y6
	TESTQ   R9, R9
	JZ      mom8nowd
	VFMADD231PS Y4, Y5, Y6

mom8nowd:
	VMULPS      (BX)(AX*4), Y0, Y3
	VFMADD231PS Y6, Y1, Y3
	VMOVUPS     Y3, (BX)(AX*4)
	VFMADD231PS Y3, Y2, Y4
	VMOVUPS     Y4, (DI)(AX*4)
	ADDQ        $8, AX
	JMP         mom8

mom1:
	CMPQ AX, CX
	JGE  momdone
	VMOVSS (DI)(AX*4), X4
	VMOVSS (SI)(AX*4), X6
	TESTQ  R9, R9
	JZ     mom1nowd
	VFMADD231SS X4, X5, X6

mom1nowd:
	VMULSS      (BX)(AX*4), X0, X3
	VFMADD231SS X6, X1, X3
	VMOVSS      X3, (BX)(AX*4)
	VFMADD231SS X3, X2, X4
	VMOVSS      X4, (DI)(AX*4)
	INCQ        AX
	JMP         mom1

momdone:
	VZEROUPPER
	RET

// func adamFMA32(p, g, m, v []float32, k *adamScalars32)
// For i < len(p), in torch's operation order:
//   g = fma(wd, p, g) when k.l2 is set (Adam's L2 decay; decay is then 1);
//   p = p·decay; m = fma(omb1, g, m·b1); v = fma(omb2·g, g, v·b2);
//   p = p + (negStep·m) / (sqrt(v)/bc2s + eps).
// len(g), len(m), len(v) >= len(p).
TEXT ·adamFMA32(SB), NOSPLIT, $0-104
	MOVQ p_base+0(FP), DI
	MOVQ p_len+8(FP), CX
	MOVQ g_base+24(FP), SI
	MOVQ m_base+48(FP), R8
	MOVQ v_base+72(FP), R9
	MOVQ k+96(FP), R10
	VBROADCASTSS 0(R10), Y0   // decay
	VBROADCASTSS 4(R10), Y1   // omb1
	VBROADCASTSS 8(R10), Y2   // b1
	VBROADCASTSS 12(R10), Y3  // omb2
	VBROADCASTSS 16(R10), Y4  // b2
	VBROADCASTSS 20(R10), Y5  // bc2s
	VBROADCASTSS 24(R10), Y6  // eps
	VBROADCASTSS 28(R10), Y7  // negStep
	VBROADCASTSS 32(R10), Y15 // wd
	MOVL 36(R10), R11         // l2
	XORQ AX, AX
	MOVQ CX, DX
	ANDQ $-8, DX

adam8:
	CMPQ AX, DX
	JGE  adam1
	VMOVUPS (DI)(AX*4), Y8
	VMOVUPS (SI)(AX*4), Y9
	TESTL   R11, R11
	JZ      adam8nol2
	VFMADD231PS Y8, Y15, Y9

adam8nol2:
	VMULPS      Y0, Y8, Y8
	VMULPS      (R8)(AX*4), Y2, Y10
	VFMADD231PS Y9, Y1, Y10
	VMOVUPS     Y10, (R8)(AX*4)
	VMULPS      (R9)(AX*4), Y4, Y11
	VMULPS      Y9, Y3, Y12
	VFMADD231PS Y9, Y12, Y11
	VMOVUPS     Y11, (R9)(AX*4)
	VSQRTPS     Y11, Y12
	VDIVPS      Y5, Y12, Y12
	VADDPS      Y6, Y12, Y12
	VMULPS      Y10, Y7, Y13
	VDIVPS      Y12, Y13, Y13
	VADDPS      Y13, Y8, Y8
	VMOVUPS     Y8, (DI)(AX*4)
	ADDQ        $8, AX
	JMP         adam8

adam1:
	CMPQ AX, CX
	JGE  adamdone
	VMOVSS (DI)(AX*4), X8
	VMOVSS (SI)(AX*4), X9
	TESTL  R11, R11
	JZ     adam1nol2
	VFMADD231SS X8, X15, X9

adam1nol2:
	VMULSS      X0, X8, X8
	VMULSS      (R8)(AX*4), X2, X10
	VFMADD231SS X9, X1, X10
	VMOVSS      X10, (R8)(AX*4)
	VMULSS      (R9)(AX*4), X4, X11
	VMULSS      X9, X3, X12
	VFMADD231SS X9, X12, X11
	VMOVSS      X11, (R9)(AX*4)
	VSQRTSS     X11, X11, X12
	VDIVSS      X5, X12, X12
	VADDSS      X6, X12, X12
	VMULSS      X10, X7, X13
	VDIVSS      X12, X13, X13
	VADDSS      X13, X8, X8
	VMOVSS      X8, (DI)(AX*4)
	INCQ        AX
	JMP         adam1

adamdone:
	VZEROUPPER
	RET
