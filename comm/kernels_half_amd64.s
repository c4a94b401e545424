//go:build !purego

#include "textflag.h"

// 16-bit float kernels, eight elements per iteration; each stops at
// len(dst) rounded down to a multiple of 8 (the Go caller does the tail) and
// reads src at least as far. Float16 uses F16C (VCVTPS2PH with imm8 0:
// round to nearest, ties to even, whatever MXCSR says); bfloat16 uses AVX2
// integer operations on the float32 bits, the same arithmetic as
// BFloat16From. Additions are single IEEE float32 additions, as in Go.

// Every kernel here is func(dst, src []T) with one loop: EIGHTS_BEGIN sets
// DI = &dst[0], SI = &src[0], CX = len(dst) rounded down to a multiple of 8
// (returning at once when that is 0) and AX = 0; the body, at the label
// loop, handles elements AX to AX+7; EIGHTS_NEXT steps AX by 8, goes back to
// loop while AX < CX, and returns. (go vet checks each TEXT line's frame
// size against the Go declaration, not the offsets in a macro.)
#define EIGHTS_BEGIN \
	MOVQ dst_base+0(FP), DI  \
	MOVQ dst_len+8(FP), CX   \
	MOVQ src_base+24(FP), SI \
	ANDQ $-8, CX             \
	JZ   done                \
	XORQ AX, AX

#define EIGHTS_NEXT \
	ADDQ $8, AX \
	CMPQ AX, CX \
	JB   loop   \
	VZEROUPPER  \
done:               \
	RET

// func cvtPH2PS(dst []float32, src []uint16)
TEXT ·cvtPH2PS(SB), NOSPLIT, $0-48
	EIGHTS_BEGIN
loop:
	VCVTPH2PS (SI)(AX*2), Y0
	VMOVUPS   Y0, (DI)(AX*4)
	EIGHTS_NEXT

// func cvtPS2PH(dst []uint16, src []float32)
TEXT ·cvtPS2PH(SB), NOSPLIT, $0-48
	EIGHTS_BEGIN
loop:
	VMOVUPS   (SI)(AX*4), Y0
	VCVTPS2PH $0, Y0, (DI)(AX*2)
	EIGHTS_NEXT

// func addPH(dst []float32, src []uint16)
// dst[i] += float32(src[i])
TEXT ·addPH(SB), NOSPLIT, $0-48
	EIGHTS_BEGIN
loop:
	VCVTPH2PS (SI)(AX*2), Y0
	VADDPS    (DI)(AX*4), Y0, Y0
	VMOVUPS   Y0, (DI)(AX*4)
	EIGHTS_NEXT

// func cvtBF2PS(dst []float32, src []uint16)
TEXT ·cvtBF2PS(SB), NOSPLIT, $0-48
	EIGHTS_BEGIN
loop:
	VPMOVZXWD (SI)(AX*2), Y0
	VPSLLD    $16, Y0, Y0
	VMOVDQU   Y0, (DI)(AX*4)
	EIGHTS_NEXT

// func addBF(dst []float32, src []uint16)
// dst[i] += float32(src[i])
TEXT ·addBF(SB), NOSPLIT, $0-48
	EIGHTS_BEGIN
loop:
	VPMOVZXWD (SI)(AX*2), Y0
	VPSLLD    $16, Y0, Y0
	VADDPS    (DI)(AX*4), Y0, Y0
	VMOVUPS   Y0, (DI)(AX*4)
	EIGHTS_NEXT

DATA bfconst<>+0(SB)/4, $0x00007fff // rounding bias
DATA bfconst<>+4(SB)/4, $0x7fffffff // magnitude mask
DATA bfconst<>+8(SB)/4, $0x7f800000 // infinity
DATA bfconst<>+12(SB)/4, $0x00000040 // quiet bit of a bfloat16 NaN
DATA bfconst<>+16(SB)/4, $0x00000001
GLOBL bfconst<>(SB), RODATA|NOPTR, $20

// func cvtPS2BF(dst []uint16, src []float32)
// dst[i] = (b + 0x7fff + (b>>16)&1) >> 16 for b the bits of src[i], or for a
// NaN (b&0x7fffffff > 0x7f800000) b>>16 | 0x40.
TEXT ·cvtPS2BF(SB), NOSPLIT, $0-48
	EIGHTS_BEGIN
	VPBROADCASTD bfconst<>+0(SB), Y8
	VPBROADCASTD bfconst<>+4(SB), Y9
	VPBROADCASTD bfconst<>+8(SB), Y10
	VPBROADCASTD bfconst<>+12(SB), Y11
	VPBROADCASTD bfconst<>+16(SB), Y12
loop:
	VMOVDQU  (SI)(AX*4), Y0
	VPSRLD   $16, Y0, Y1      // b>>16
	VPAND    Y12, Y1, Y2      // (b>>16)&1
	VPADDD   Y8, Y0, Y3       // b + 0x7fff
	VPADDD   Y2, Y3, Y3
	VPSRLD   $16, Y3, Y3      // rounded
	VPOR     Y11, Y1, Y4      // NaN made quiet
	VPAND    Y9, Y0, Y5       // |b|
	VPCMPGTD Y10, Y5, Y5      // |b| > inf: NaN
	VPBLENDVB Y5, Y4, Y3, Y3
	VEXTRACTI128 $1, Y3, X4
	VPACKUSDW X4, X3, X3
	VMOVDQU  X3, (DI)(AX*2)
	EIGHTS_NEXT
