//go:build !purego

package cpufeat

//go:noescape
func cpuid(leaf, sub uint32) (eax, ebx, ecx, edx uint32)

//go:noescape
func xgetbv0() (eax, edx uint32)

// FMA reports AVX and FMA3 in the processor and the YMM state saved by the
// operating system: what 256-bit fused multiply-add kernels need.
var FMA = func() bool {
	if max, _, _, _ := cpuid(0, 0); max < 1 {
		return false
	}
	_, _, ecx, _ := cpuid(1, 0)
	const fma, osxsave, avx = 1 << 12, 1 << 27, 1 << 28
	if ecx&(fma|osxsave|avx) != fma|osxsave|avx {
		return false
	}
	xcr0, _ := xgetbv0()
	return xcr0&6 == 6 // XMM and YMM state
}()
