//go:build !purego

package cpufeat

// AVX512 reports the AVX-512 Foundation and Vector Length extensions in the
// processor (AVX512F, AVX512VL) and the opmask, upper-ZMM and ZMM16-31
// state saved by the operating system (XCR0 bits 5, 6 and 7, with the XMM
// and YMM state): what blas's 512-bit matrix kernels need. A processor with
// the instructions under an operating system that does not save the wide
// registers reports false, and the 256-bit kernels run instead.
var AVX512 = func() bool {
	if max, _, _, _ := cpuid(0, 0); max < 7 {
		return false
	}
	if _, _, ecx, _ := cpuid(1, 0); ecx&(1<<27) == 0 { // OSXSAVE: XGETBV works
		return false
	}
	const f, vl = 1 << 16, 1 << 31
	if _, ebx, _, _ := cpuid(7, 0); ebx&(f|vl) != f|vl {
		return false
	}
	xcr0, _ := xgetbv0()
	const state = 1<<1 | 1<<2 | 1<<5 | 1<<6 | 1<<7 // XMM, YMM, opmask, ZMM0-15 upper halves, ZMM16-31
	return xcr0&state == state
}()
