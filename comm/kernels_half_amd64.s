//go:build !purego

#include "textflag.h"

// func cvtPH2PS(dst []float32, src []uint16)
TEXT ·cvtPH2PS(SB), NOSPLIT, $0-48
	MOVQ dst_base+0(FP), DI
	MOVQ dst_len+8(FP), CX
	MOVQ src_base+24(FP), SI
	ANDQ $-8, CX
	JZ   ph2psdone
	XORQ AX, AX
ph2psloop:
	VCVTPH2PS (SI)(AX*2), Y0
	VMOVUPS   Y0, (DI)(AX*4)
	ADDQ      $8, AX
	CMPQ      AX, CX
	JB        ph2psloop
	VZEROUPPER
ph2psdone:
	RET

// func cvtPS2PH(dst []uint16, src []float32)
TEXT ·cvtPS2PH(SB), NOSPLIT, $0-48
	MOVQ dst_base+0(FP), DI
	MOVQ dst_len+8(FP), CX
	MOVQ src_base+24(FP), SI
	ANDQ $-8, CX
	JZ   ps2phdone
	XORQ AX, AX
ps2phloop:
	VMOVUPS   (SI)(AX*4), Y0
	VCVTPS2PH $0, Y0, (DI)(AX*2)
	ADDQ      $8, AX
	CMPQ      AX, CX
	JB        ps2phloop
	VZEROUPPER
ps2phdone:
	RET
