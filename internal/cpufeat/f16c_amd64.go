//go:build !purego

package cpufeat

// F16C reports the F16C conversions (VCVTPH2PS, VCVTPS2PH between float16
// and float32) and the YMM state saved by the operating system.
var F16C = func() bool {
	if max, _, _, _ := cpuid(0, 0); max < 1 {
		return false
	}
	_, _, ecx, _ := cpuid(1, 0)
	const f16c, osxsave, avx = 1 << 29, 1 << 27, 1 << 28
	if ecx&(f16c|osxsave|avx) != f16c|osxsave|avx {
		return false
	}
	xcr0, _ := xgetbv0()
	return xcr0&6 == 6
}()
