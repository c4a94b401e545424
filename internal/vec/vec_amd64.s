//go:build amd64 && !purego

#include "textflag.h"

// Each kernel loads dst into DI, its sources into SI and DX, n into CX, and
// runs LOOP8 over its step, eight elements at AX (an element index) in Y
// registers; Y15 holds zeros where a step needs them.

// LOOP8 runs STEP for AX = 0, 8, ... below CX (a positive multiple of 8).
#define LOOP8(STEP) \
	XORQ AX, AX \
loop:               \
	STEP        \
	ADDQ $8, AX \
	CMPQ AX, CX \
	JLT  loop   \
	VZEROUPPER  \
	RET

#define ARGS3 \
	MOVQ dst+0(FP), DI \
	MOVQ x+8(FP), SI   \
	MOVQ y+16(FP), DX  \
	MOVQ n+24(FP), CX

// dst = x + y.
#define ADD_STEP \
	VMOVUPS (SI)(AX*4), Y0        \
	VADDPS  (DX)(AX*4), Y0, Y0    \
	VMOVUPS Y0, (DI)(AX*4)

// dst = x * y.
#define MUL_STEP \
	VMOVUPS (SI)(AX*4), Y0        \
	VMULPS  (DX)(AX*4), Y0, Y0    \
	VMOVUPS Y0, (DI)(AX*4)

// dst = max(x + y, 0) as Go's max: VMAXPS returns its second source (the
// sum) when either is NaN or both are zeros, so a NaN stays and a -0
// comes out -0, which adding +0 turns into +0 (and leaves every other
// value as it is).
#define ADD_RELU_STEP \
	VMOVUPS (SI)(AX*4), Y0        \
	VADDPS  (DX)(AX*4), Y0, Y0    \
	VMAXPS  Y0, Y15, Y0           \
	VADDPS  Y15, Y0, Y0           \
	VMOVUPS Y0, (DI)(AX*4)

// dst += x.
#define ADD_TO_STEP \
	VMOVUPS (DI)(AX*4), Y0        \
	VADDPS  (SI)(AX*4), Y0, Y0    \
	VMOVUPS Y0, (DI)(AX*4)

// dst = dy where x > 0 (ordered: false for NaN), +0 elsewhere.
#define RELU_MASK_STEP \
	VMOVUPS (SI)(AX*4), Y0        \
	VCMPPS  $0x1e, Y15, Y0, Y1    \
	VANDPS  (DX)(AX*4), Y1, Y1    \
	VMOVUPS Y1, (DI)(AX*4)

// func addAVX(dst, x, y *float32, n int)
TEXT ·addAVX(SB), NOSPLIT, $0-32
	ARGS3
	LOOP8(ADD_STEP)

// func mulAVX(dst, x, y *float32, n int)
TEXT ·mulAVX(SB), NOSPLIT, $0-32
	ARGS3
	LOOP8(MUL_STEP)

// func addReLUAVX(dst, x, y *float32, n int)
TEXT ·addReLUAVX(SB), NOSPLIT, $0-32
	ARGS3
	VXORPS Y15, Y15, Y15
	LOOP8(ADD_RELU_STEP)

// func addToAVX(dst, x *float32, n int)
TEXT ·addToAVX(SB), NOSPLIT, $0-24
	MOVQ dst+0(FP), DI
	MOVQ x+8(FP), SI
	MOVQ n+16(FP), CX
	LOOP8(ADD_TO_STEP)

// func reluMaskAVX(dst, x, dy *float32, n int)
TEXT ·reluMaskAVX(SB), NOSPLIT, $0-32
	MOVQ dst+0(FP), DI
	MOVQ x+8(FP), SI
	MOVQ dy+16(FP), DX
	MOVQ n+24(FP), CX
	VXORPS Y15, Y15, Y15
	LOOP8(RELU_MASK_STEP)
