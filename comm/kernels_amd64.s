#include "textflag.h"

// SSE2 loops (part of every amd64 CPU) for the float reductions that
// all-reduce spends its time in. Each adds or multiplies elementwise,
// dst[i] = dst[i] op src[i], exactly as the scalar Go loop does (the same
// IEEE operations, no reassociation, no fused multiply-add), 64 bytes per
// iteration, then one element at a time for the tail. len(src) >= len(dst).

// ELEMENTWISE_ARGS loads the arguments, each kernel's own (go vet checks
// each TEXT line's frame size against the Go declaration, not the offsets
// in a macro): DI dst, CX len(dst), SI src, AX the index (0), BX the
// elements the vector loop covers (len(dst) rounded down to N); with none
// it goes to the tail.
#define ELEMENTWISE_ARGS(N) \
	MOVQ dst_base+0(FP), DI  \
	MOVQ dst_len+8(FP), CX   \
	MOVQ src_base+24(FP), SI \
	XORQ AX, AX              \
	MOVQ CX, BX              \
	ANDQ $-N, BX             \
	JZ   tail

// ELEMENTWISE_TAIL is the scalar loop after the vectors, one element of
// SIZE bytes at a time (MOVS and OPS), then the return.
#define ELEMENTWISE_TAIL(MOVS, OPS, SIZE) \
tail:                          \
	CMPQ AX, CX            \
	JAE  done              \
	MOVS (DI)(AX*SIZE), X0 \
	OPS  (SI)(AX*SIZE), X0 \
	MOVS X0, (DI)(AX*SIZE) \
	INCQ AX                \
	JMP  tail              \
done:                          \
	RET

// ELEMENTWISE is the body of every kernel here, func(dst, src []T):
// dst[i] = dst[i] op src[i] for i < len(dst), in four 16-byte vectors an
// iteration (MOVV and OPV, N elements) and then one element at a time (MOVS
// and OPS), elements SIZE bytes wide.
#define ELEMENTWISE(MOVV, OPV, MOVS, OPS, SIZE, N) \
	ELEMENTWISE_ARGS(N)              \
loop:                                    \
	MOVV (DI)(AX*SIZE), X0           \
	MOVV 16(DI)(AX*SIZE), X1         \
	MOVV 32(DI)(AX*SIZE), X2         \
	MOVV 48(DI)(AX*SIZE), X3         \
	MOVV (SI)(AX*SIZE), X4           \
	MOVV 16(SI)(AX*SIZE), X5         \
	MOVV 32(SI)(AX*SIZE), X6         \
	MOVV 48(SI)(AX*SIZE), X7         \
	OPV  X4, X0                      \
	OPV  X5, X1                      \
	OPV  X6, X2                      \
	OPV  X7, X3                      \
	MOVV X0, (DI)(AX*SIZE)           \
	MOVV X1, 16(DI)(AX*SIZE)         \
	MOVV X2, 32(DI)(AX*SIZE)         \
	MOVV X3, 48(DI)(AX*SIZE)         \
	ADDQ $N, AX                      \
	CMPQ AX, BX                      \
	JB   loop                        \
	ELEMENTWISE_TAIL(MOVS, OPS, SIZE)

// func addF32SSE(dst, src []float32)
TEXT ·addF32SSE(SB), NOSPLIT, $0-48
	ELEMENTWISE(MOVUPS, ADDPS, MOVSS, ADDSS, 4, 16)

// func mulF32(dst, src []float32)
TEXT ·mulF32(SB), NOSPLIT, $0-48
	ELEMENTWISE(MOVUPS, MULPS, MOVSS, MULSS, 4, 16)

// func addF64SSE(dst, src []float64)
TEXT ·addF64SSE(SB), NOSPLIT, $0-48
	ELEMENTWISE(MOVUPD, ADDPD, MOVSD, ADDSD, 8, 8)

// func mulF64(dst, src []float64)
TEXT ·mulF64(SB), NOSPLIT, $0-48
	ELEMENTWISE(MOVUPD, MULPD, MOVSD, MULSD, 8, 8)

// ELEMENTWISE_AVX is ELEMENTWISE in four 32-byte vectors an iteration
// (VMOVV and the three-operand VOPV), for processors with AVX; it clears
// the vector registers' upper halves before returning.
#define ELEMENTWISE_AVX(VMOVV, VOPV, MOVS, OPS, SIZE, N) \
	ELEMENTWISE_ARGS(N)              \
loop:                                    \
	VMOVV (DI)(AX*SIZE), Y0          \
	VMOVV 32(DI)(AX*SIZE), Y1        \
	VMOVV 64(DI)(AX*SIZE), Y2        \
	VMOVV 96(DI)(AX*SIZE), Y3        \
	VOPV  (SI)(AX*SIZE), Y0, Y0      \
	VOPV  32(SI)(AX*SIZE), Y1, Y1    \
	VOPV  64(SI)(AX*SIZE), Y2, Y2    \
	VOPV  96(SI)(AX*SIZE), Y3, Y3    \
	VMOVV Y0, (DI)(AX*SIZE)          \
	VMOVV Y1, 32(DI)(AX*SIZE)        \
	VMOVV Y2, 64(DI)(AX*SIZE)        \
	VMOVV Y3, 96(DI)(AX*SIZE)        \
	ADDQ $N, AX                      \
	CMPQ AX, BX                      \
	JB   loop                        \
	VZEROUPPER                       \
	ELEMENTWISE_TAIL(MOVS, OPS, SIZE)

// func addF32AVX(dst, src []float32)
TEXT ·addF32AVX(SB), NOSPLIT, $0-48
	ELEMENTWISE_AVX(VMOVUPS, VADDPS, MOVSS, ADDSS, 4, 32)

// func addF64AVX(dst, src []float64)
TEXT ·addF64AVX(SB), NOSPLIT, $0-48
	ELEMENTWISE_AVX(VMOVUPD, VADDPD, MOVSD, ADDSD, 8, 16)

// func copyStreamAligned(dst, src []byte)
// Copies len(dst) bytes, a multiple of 64, from src to dst (16-byte
// aligned) with non-temporal stores, which write around the caches
// without reading the destination's lines first, then fences them so
// that later stores are seen after them.
TEXT ·copyStreamAligned(SB), NOSPLIT, $0-48
	MOVQ dst_base+0(FP), DI
	MOVQ dst_len+8(FP), CX
	MOVQ src_base+24(FP), SI
	XORQ AX, AX
	TESTQ CX, CX
	JZ   fence
stream:
	MOVOU (SI)(AX*1), X0
	MOVOU 16(SI)(AX*1), X1
	MOVOU 32(SI)(AX*1), X2
	MOVOU 48(SI)(AX*1), X3
	MOVNTO X0, (DI)(AX*1)
	MOVNTO X1, 16(DI)(AX*1)
	MOVNTO X2, 32(DI)(AX*1)
	MOVNTO X3, 48(DI)(AX*1)
	ADDQ $64, AX
	CMPQ AX, CX
	JB   stream
fence:
	SFENCE
	RET

// func addF32x3AVX(dst, a, b, c []float32)
// dst[i] = ((dst[i] + a[i]) + b[i]) + c[i] for i < len(dst): three passes
// of addF32 in one, the same additions in the same order. a, b and c are
// at least as long as dst.
TEXT ·addF32x3AVX(SB), NOSPLIT, $0-96
	MOVQ dst_base+0(FP), DI
	MOVQ dst_len+8(FP), CX
	MOVQ a_base+24(FP), SI
	MOVQ b_base+48(FP), R8
	MOVQ c_base+72(FP), R9
	XORQ AX, AX
	MOVQ CX, BX
	ANDQ $-16, BX
	JZ   tail3
loop3:
	VMOVUPS (DI)(AX*4), Y0
	VMOVUPS 32(DI)(AX*4), Y1
	VADDPS  (SI)(AX*4), Y0, Y0
	VADDPS  32(SI)(AX*4), Y1, Y1
	VADDPS  (R8)(AX*4), Y0, Y0
	VADDPS  32(R8)(AX*4), Y1, Y1
	VADDPS  (R9)(AX*4), Y0, Y0
	VADDPS  32(R9)(AX*4), Y1, Y1
	VMOVUPS Y0, (DI)(AX*4)
	VMOVUPS Y1, 32(DI)(AX*4)
	ADDQ $16, AX
	CMPQ AX, BX
	JB   loop3
	VZEROUPPER
tail3:
	CMPQ AX, CX
	JAE  done3
	MOVSS (DI)(AX*4), X0
	ADDSS (SI)(AX*4), X0
	ADDSS (R8)(AX*4), X0
	ADDSS (R9)(AX*4), X0
	MOVSS X0, (DI)(AX*4)
	INCQ AX
	JMP  tail3
done3:
	RET
