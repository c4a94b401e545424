#include "textflag.h"

// SSE2 loops (part of every amd64 CPU) for the float reductions that
// all-reduce spends its time in. Each adds or multiplies elementwise,
// dst[i] = dst[i] op src[i], exactly as the scalar Go loop does (the same
// IEEE operations, no reassociation, no fused multiply-add), 64 bytes per
// iteration, then one element at a time for the tail. len(src) >= len(dst).

// func addF32(dst, src []float32)
TEXT ·addF32(SB), NOSPLIT, $0-48
	MOVQ dst_base+0(FP), DI
	MOVQ dst_len+8(FP), CX
	MOVQ src_base+24(FP), SI
	XORQ AX, AX
	MOVQ CX, BX
	ANDQ $-16, BX
	JZ   addf32tail
addf32loop:
	MOVUPS (DI)(AX*4), X0
	MOVUPS 16(DI)(AX*4), X1
	MOVUPS 32(DI)(AX*4), X2
	MOVUPS 48(DI)(AX*4), X3
	MOVUPS (SI)(AX*4), X4
	MOVUPS 16(SI)(AX*4), X5
	MOVUPS 32(SI)(AX*4), X6
	MOVUPS 48(SI)(AX*4), X7
	ADDPS  X4, X0
	ADDPS  X5, X1
	ADDPS  X6, X2
	ADDPS  X7, X3
	MOVUPS X0, (DI)(AX*4)
	MOVUPS X1, 16(DI)(AX*4)
	MOVUPS X2, 32(DI)(AX*4)
	MOVUPS X3, 48(DI)(AX*4)
	ADDQ   $16, AX
	CMPQ   AX, BX
	JB     addf32loop
addf32tail:
	CMPQ  AX, CX
	JAE   addf32done
	MOVSS (DI)(AX*4), X0
	ADDSS (SI)(AX*4), X0
	MOVSS X0, (DI)(AX*4)
	INCQ  AX
	JMP   addf32tail
addf32done:
	RET

// func mulF32(dst, src []float32)
TEXT ·mulF32(SB), NOSPLIT, $0-48
	MOVQ dst_base+0(FP), DI
	MOVQ dst_len+8(FP), CX
	MOVQ src_base+24(FP), SI
	XORQ AX, AX
	MOVQ CX, BX
	ANDQ $-16, BX
	JZ   mulf32tail
mulf32loop:
	MOVUPS (DI)(AX*4), X0
	MOVUPS 16(DI)(AX*4), X1
	MOVUPS 32(DI)(AX*4), X2
	MOVUPS 48(DI)(AX*4), X3
	MOVUPS (SI)(AX*4), X4
	MOVUPS 16(SI)(AX*4), X5
	MOVUPS 32(SI)(AX*4), X6
	MOVUPS 48(SI)(AX*4), X7
	MULPS  X4, X0
	MULPS  X5, X1
	MULPS  X6, X2
	MULPS  X7, X3
	MOVUPS X0, (DI)(AX*4)
	MOVUPS X1, 16(DI)(AX*4)
	MOVUPS X2, 32(DI)(AX*4)
	MOVUPS X3, 48(DI)(AX*4)
	ADDQ   $16, AX
	CMPQ   AX, BX
	JB     mulf32loop
mulf32tail:
	CMPQ  AX, CX
	JAE   mulf32done
	MOVSS (DI)(AX*4), X0
	MULSS (SI)(AX*4), X0
	MOVSS X0, (DI)(AX*4)
	INCQ  AX
	JMP   mulf32tail
mulf32done:
	RET

// func addF64(dst, src []float64)
TEXT ·addF64(SB), NOSPLIT, $0-48
	MOVQ dst_base+0(FP), DI
	MOVQ dst_len+8(FP), CX
	MOVQ src_base+24(FP), SI
	XORQ AX, AX
	MOVQ CX, BX
	ANDQ $-8, BX
	JZ   addf64tail
addf64loop:
	MOVUPD (DI)(AX*8), X0
	MOVUPD 16(DI)(AX*8), X1
	MOVUPD 32(DI)(AX*8), X2
	MOVUPD 48(DI)(AX*8), X3
	MOVUPD (SI)(AX*8), X4
	MOVUPD 16(SI)(AX*8), X5
	MOVUPD 32(SI)(AX*8), X6
	MOVUPD 48(SI)(AX*8), X7
	ADDPD  X4, X0
	ADDPD  X5, X1
	ADDPD  X6, X2
	ADDPD  X7, X3
	MOVUPD X0, (DI)(AX*8)
	MOVUPD X1, 16(DI)(AX*8)
	MOVUPD X2, 32(DI)(AX*8)
	MOVUPD X3, 48(DI)(AX*8)
	ADDQ   $8, AX
	CMPQ   AX, BX
	JB     addf64loop
addf64tail:
	CMPQ  AX, CX
	JAE   addf64done
	MOVSD (DI)(AX*8), X0
	ADDSD (SI)(AX*8), X0
	MOVSD X0, (DI)(AX*8)
	INCQ  AX
	JMP   addf64tail
addf64done:
	RET

// func mulF64(dst, src []float64)
TEXT ·mulF64(SB), NOSPLIT, $0-48
	MOVQ dst_base+0(FP), DI
	MOVQ dst_len+8(FP), CX
	MOVQ src_base+24(FP), SI
	XORQ AX, AX
	MOVQ CX, BX
	ANDQ $-8, BX
	JZ   mulf64tail
mulf64loop:
	MOVUPD (DI)(AX*8), X0
	MOVUPD 16(DI)(AX*8), X1
	MOVUPD 32(DI)(AX*8), X2
	MOVUPD 48(DI)(AX*8), X3
	MOVUPD (SI)(AX*8), X4
	MOVUPD 16(SI)(AX*8), X5
	MOVUPD 32(SI)(AX*8), X6
	MOVUPD 48(SI)(AX*8), X7
	MULPD  X4, X0
	MULPD  X5, X1
	MULPD  X6, X2
	MULPD  X7, X3
	MOVUPD X0, (DI)(AX*8)
	MOVUPD X1, 16(DI)(AX*8)
	MOVUPD X2, 32(DI)(AX*8)
	MOVUPD X3, 48(DI)(AX*8)
	ADDQ   $8, AX
	CMPQ   AX, BX
	JB     mulf64loop
mulf64tail:
	CMPQ  AX, CX
	JAE   mulf64done
	MOVSD (DI)(AX*8), X0
	MULSD (SI)(AX*8), X0
	MOVSD X0, (DI)(AX*8)
	INCQ  AX
	JMP   mulf64tail
mulf64done:
	RET
