// Macros shared by the 256-bit kernels (sgemm_amd64.s) and the 512-bit ones
// (sgemm512_amd64.s): each family's tile kernel and dot kernel compute the
// same product in the same order, and differ only in their registers and
// widths, which the macros take as arguments.

// TILE_ARGS loads a tile kernel's arguments, func(k int, a, b *float32,
// ldb int, c *float32, ldc int, alpha float32, acc bool): CX = k, AX = a,
// BX = b, R9 = ldb in bytes, DI = c, DX = ldc in bytes. (go vet reads only
// .s files: it checks the tile kernels' frame sizes and their alpha and acc
// loads, not these offsets.)
#define TILE_ARGS \
	MOVQ k+0(FP), CX    \
	MOVQ a+8(FP), AX    \
	MOVQ b+16(FP), BX   \
	MOVQ ldb+24(FP), R9 \
	SHLQ $2, R9         \
	MOVQ c+32(FP), DI   \
	MOVQ ldc+40(FP), DX \
	SHLQ $2, DX

// TILER_ARGS loads the arguments an in-place tile kernel (sgemmTile6x16R,
// sgemmTile8x32R) reads in its loop, func(k int, a *float32, lda int, b
// *float32, ldb int, c *float32, ldc int, alpha float32, acc bool): CX =
// k, AX = a (row 0), R8 = lda in bytes, R12 = A's row 3, BX = b, R9 = ldb
// in bytes.
#define TILER_ARGS \
	MOVQ k+0(FP), CX     \
	MOVQ a+8(FP), AX     \
	MOVQ lda+16(FP), R8  \
	SHLQ $2, R8          \
	LEAQ (AX)(R8*2), R12 \
	ADDQ R8, R12         \
	MOVQ b+24(FP), BX    \
	MOVQ ldb+32(FP), R9  \
	SHLQ $2, R9

// TILER_LOOP runs k (CX) steps of an in-place tile kernel, each loading
// the two vectors of B's row at BX (b0, and b1 w bytes on) and running
// STEP, which broadcasts an element of each of A's rows at offsets from
// AX and R12 into the accumulators and moves any other row pointers on;
// AX and R12 then move on a term, BX on ldb (R9). It ends at the label
// rstore.
#define TILER_LOOP(STEP, w, b0, b1) \
	TESTQ CX, CX      \
	JEQ   rstore      \
rloop:                    \
	VMOVUPS (BX), b0  \
	VMOVUPS w(BX), b1 \
	STEP              \
	ADDQ    $4, AX    \
	ADDQ    $4, R12   \
	ADDQ    R9, BX    \
	DECQ    CX        \
	JNE     rloop     \
rstore:

// TILER_OUT loads the rest for an in-place tile kernel's STORE: DI = c,
// DX = ldc in bytes, alpha broadcast into areg, R10 = acc.
#define TILER_OUT(areg) \
	MOVQ         c+40(FP), DI     \
	MOVQ         ldc+48(FP), DX   \
	SHLQ         $2, DX           \
	VBROADCASTSS alpha+56(FP), areg \
	MOVBLZX      acc+60(FP), R10

// TILE_LOOP runs k (CX) steps of a tile kernel, each loading the two
// vectors of B's row at BX (b0, and b1 w bytes on) and running STEP, which
// multiplies them by the broadcast elements of A's packed column at AX into
// the accumulators; AX then moves on abytes and BX on ldb (R9). It ends at
// the label store.
#define TILE_LOOP(STEP, w, abytes, b0, b1) \
	TESTQ CX, CX        \
	JEQ   store         \
loop:                       \
	VMOVUPS (BX), b0    \
	VMOVUPS w(BX), b1   \
	STEP                \
	ADDQ    $abytes, AX \
	ADDQ    R9, BX      \
	DECQ    CX          \
	JNE     loop        \
store:

// BCAST_FMA, one row of a tile step: a = A's element at off(AX), broadcast;
// lo += a·b0; hi += a·b1.
#define BCAST_FMA(off, a, b0, b1, lo, hi) \
	VBROADCASTSS off(AX), a   \
	VFMADD231PS  b0, a, lo    \
	VFMADD231PS  b1, a, hi

// BCAST_AT, one row of an in-place tile kernel's step: a = A's element at
// the address src, broadcast; lo += a·b0; hi += a·b1.
#define BCAST_AT(src, a, b0, b1, lo, hi) \
	VBROADCASTSS src, a       \
	VFMADD231PS  b0, a, lo    \
	VFMADD231PS  b1, a, hi

// TILE_ACC_ROW adds alpha·lo and alpha·hi into the row of C at DI (hi's
// part w bytes on); t0 and t1 are scratch. TILE_SET_ROW writes them over it.
#define TILE_ACC_ROW(lo, hi, alpha, t0, t1, w) \
	VMOVUPS     (DI), t0        \
	VMOVUPS     w(DI), t1       \
	VFMADD231PS lo, alpha, t0   \
	VFMADD231PS hi, alpha, t1   \
	VMOVUPS     t0, (DI)        \
	VMOVUPS     t1, w(DI)

#define TILE_SET_ROW(lo, hi, alpha, t0, t1, w) \
	VMULPS  lo, alpha, t0 \
	VMULPS  hi, alpha, t1 \
	VMOVUPS t0, (DI)      \
	VMOVUPS t1, w(DI)

// HSUM4 folds a dot kernel's four 8-lane sums y0..y3 (of one row of A
// with four rows of B) into the row's four totals in x0, the low half of
// y0 (x1 is that of y1): three horizontal adds and a lane add.
#define HSUM4(y0, y1, y2, y3, x0, x1) \
	VHADDPS      y1, y0, y0 \
	VHADDPS      y3, y2, y2 \
	VHADDPS      y2, y0, y0 \
	VEXTRACTF128 $1, y0, x1 \
	VADDPS       x1, x0, x0

// DOT_ACC_ROW adds alpha·s, a row's four totals, into the row of C at DI;
// t is scratch. DOT_SET_ROW writes them over it.
#define DOT_ACC_ROW(s, alpha, t) \
	VMOVUPS     (DI), t     \
	VFMADD231PS s, alpha, t \
	VMOVUPS     t, (DI)

#define DOT_SET_ROW(s, alpha, t) \
	VMULPS  s, alpha, t \
	VMOVUPS t, (DI)

// STORE ends a kernel: ROWS(ACC) when the register flag (the acc argument)
// is set, ROWS(SET) when not, then returns. ROWS applies its argument to
// each row of the kernel's result, DI on the row (DX apart).
#define STORE(flag, ROWS, ACC, SET) \
	TESTQ flag, flag \
	JEQ   set        \
	ROWS(ACC)        \
	VZEROUPPER       \
	RET              \
set:                     \
	ROWS(SET)        \
	VZEROUPPER       \
	RET
