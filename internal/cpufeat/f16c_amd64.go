//go:build !purego

package cpufeat

// AVX2F16C reports AVX2 and the F16C conversions (VCVTPH2PS, VCVTPS2PH
// between float16 and float32) in the processor and the YMM state saved by
// the operating system: what comm's 16-bit float kernels need.
var AVX2F16C = func() bool {
	max, _, _, _ := cpuid(0, 0)
	if max < 7 {
		return false
	}
	_, _, ecx, _ := cpuid(1, 0)
	const f16c, osxsave, avx = 1 << 29, 1 << 27, 1 << 28
	if ecx&(f16c|osxsave|avx) != f16c|osxsave|avx {
		return false
	}
	if _, ebx, _, _ := cpuid(7, 0); ebx&(1<<5) == 0 { // AVX2
		return false
	}
	xcr0, _ := xgetbv0()
	return xcr0&6 == 6
}()
