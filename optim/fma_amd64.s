//go:build !purego

#include "textflag.h"

// The float32 update kernels of SGD and Adam: eight elements an instruction,
// then one at a time for the tail. Weight decay, where a flag asks for it,
// adds wd·p to the gradient first with one more fused multiply-add (a flag,
// not wd == 0, because fma(0, p, g) is NaN for an infinite p).

// Each kernel loads its arguments and runs EIGHTS_THEN_ONES over its step
// on the two widths: packed, eight elements at a time in Y registers, then
// scalar, one element at a time in X registers, for the tail. A step is
// written once, as a macro (SGD_STEP, MOMENTUM_STEP, ADAM_STEP) over the
// width's instructions, a label of its own and the registers of its roles;
// AX is the element index. SQRT8 and SQRT1 are the two widths' square roots
// (the scalar one names its source twice).
#define SQRT8(x, y) VSQRTPS x, y
#define SQRT1(x, y) VSQRTSS x, x, y

// EIGHTS_THEN_ONES runs STEP8, the packed step, for AX = 0, 8, ... while
// AX < CX rounded down to a multiple of 8, then STEP1, the scalar one, for
// each AX left below CX, and returns.
#define EIGHTS_THEN_ONES(STEP8, STEP1) \
	XORQ AX, AX  \
	MOVQ CX, DX  \
	ANDQ $-8, DX \
eights:              \
	CMPQ AX, DX  \
	JGE  ones    \
	STEP8        \
	ADDQ $8, AX  \
	JMP  eights  \
ones:                \
	CMPQ AX, CX  \
	JGE  done    \
	STEP1        \
	INCQ AX      \
	JMP  ones    \
done:                \
	VZEROUPPER   \
	RET

// DECAYED_GRAD loads p = p[i] from DI and g = g[i] from SI and, when the
// register flag (tested with TEST) is set, makes g = fma(wd, p, g).
#define DECAYED_GRAD(MOV, FMA, TEST, flag, nowd, p, g, wd) \
	MOV  (DI)(AX*4), p \
	MOV  (SI)(AX*4), g \
	TEST flag, flag    \
	JZ   nowd          \
	FMA  p, wd, g      \
nowd:

// SGD_STEP: d as DECAYED_GRAD makes it (hasWD in R9);
// p[i] = fma(negLR, d, p[i]).
#define SGD_STEP(MOV, FMA, nowd, negLR, p, d, wd)          \
	DECAYED_GRAD(MOV, FMA, TESTQ, R9, nowd, p, d, wd) \
	FMA d, negLR, p                                  \
	MOV p, (DI)(AX*4)

// MOMENTUM_STEP: d as DECAYED_GRAD makes it (hasWD in R9);
// b = fma(damp, d, buf[i]·mom), buf[i] = b (BX holds buf);
// p[i] = fma(negLR, b, p[i]).
#define MOMENTUM_STEP(MOV, MUL, FMA, nowd, mom, damp, negLR, b, p, wd, d) \
	DECAYED_GRAD(MOV, FMA, TESTQ, R9, nowd, p, d, wd)                \
	MUL (BX)(AX*4), mom, b                                          \
	FMA d, damp, b                                                  \
	MOV b, (BX)(AX*4)                                               \
	FMA b, negLR, p                                                 \
	MOV p, (DI)(AX*4)

// ADAM_STEP: g as DECAYED_GRAD makes it (l2 in R11); p = p·decay;
// m[i] = fma(omb1, g, m[i]·b1) (R8 holds m); v[i] = fma(omb2·g, g, v[i]·b2)
// (R9 holds v); p[i] = p + (negStep·m) / (sqrt(v)/bc2s + eps). t and u are
// scratch.
#define ADAM_STEP(MOV, MUL, FMA, DIV, ADD, SQRT, nol2, decay, omb1, b1, omb2, b2, bc2s, eps, negStep, wd, p, g, m, v, t, u) \
	DECAYED_GRAD(MOV, FMA, TESTL, R11, nol2, p, g, wd) \
	MUL  decay, p, p        \
	MUL  (R8)(AX*4), b1, m  \
	FMA  g, omb1, m         \
	MOV  m, (R8)(AX*4)      \
	MUL  (R9)(AX*4), b2, v  \
	MUL  g, omb2, t         \
	FMA  g, t, v            \
	MOV  v, (R9)(AX*4)      \
	SQRT(v, t)              \
	DIV  bc2s, t, t         \
	ADD  eps, t, t          \
	MUL  m, negStep, u      \
	DIV  t, u, u            \
	ADD  u, p, p            \
	MOV  p, (DI)(AX*4)

// SGD's step: negLR, p, d and wd in registers 0, 1, 3 and 5.
#define SGD8 SGD_STEP(VMOVUPS, VFMADD231PS, sgd8nowd, Y0, Y1, Y3, Y5)
#define SGD1 SGD_STEP(VMOVSS, VFMADD231SS, sgd1nowd, X0, X1, X3, X5)

// func sgdFMA32(p, g []float32, negLR, wd float32, hasWD bool)
// d = g, or fma(wd, p[i], g[i]); p[i] = fma(negLR, d, p[i]); len(g) >= len(p).
TEXT ·sgdFMA32(SB), NOSPLIT, $0-57
	MOVQ    p_base+0(FP), DI
	MOVQ    p_len+8(FP), CX
	MOVQ    g_base+24(FP), SI
	VBROADCASTSS negLR+48(FP), Y0
	VBROADCASTSS wd+52(FP), Y5
	MOVBLZX hasWD+56(FP), R9
	EIGHTS_THEN_ONES(SGD8, SGD1)

// The momentum step: mom, damp, negLR, b, p, wd and d in registers 0 to 6.
#define MOM8 MOMENTUM_STEP(VMOVUPS, VMULPS, VFMADD231PS, mom8nowd, Y0, Y1, Y2, Y3, Y4, Y5, Y6)
#define MOM1 MOMENTUM_STEP(VMOVSS, VMULSS, VFMADD231SS, mom1nowd, X0, X1, X2, X3, X4, X5, X6)

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
	EIGHTS_THEN_ONES(MOM8, MOM1)

// Adam's step: the scalars in registers 0 to 7 and 15 (as loaded below),
// p, g, m, v and the scratch in 8 to 13.
#define ADAM8 ADAM_STEP(VMOVUPS, VMULPS, VFMADD231PS, VDIVPS, VADDPS, SQRT8, adam8nol2, Y0, Y1, Y2, Y3, Y4, Y5, Y6, Y7, Y15, Y8, Y9, Y10, Y11, Y12, Y13)
#define ADAM1 ADAM_STEP(VMOVSS, VMULSS, VFMADD231SS, VDIVSS, VADDSS, SQRT1, adam1nol2, X0, X1, X2, X3, X4, X5, X6, X7, X15, X8, X9, X10, X11, X12, X13)

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
	EIGHTS_THEN_ONES(ADAM8, ADAM1)
