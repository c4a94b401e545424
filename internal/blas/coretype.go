package blas

import (
	"slices"
	"strings"

	"golang.org/x/sys/cpu"
)

// CoreTypeEnv is the environment variable OpenBLAS reads, once, when it is
// loaded, to choose its kernels instead of detecting the processor.
const CoreTypeEnv = "OPENBLAS_CORETYPE"

// openblasAVX512Cores and openblasAVX2Cores are OpenBLAS's x86-64 kernel
// sets that use AVX-512 and (at least) AVX2.
var (
	openblasAVX512Cores = []string{"skylakex", "cooperlake", "sapphirerapids"}
	openblasAVX2Cores   = []string{"haswell", "zen", "skylakex", "cooperlake", "sapphirerapids"}
)

// BestOpenBLASCore is the best OpenBLAS kernel set this processor runs:
// SkylakeX with AVX-512 F, CD, BW, DQ and VL, Haswell with AVX2 and FMA, ""
// otherwise.
func BestOpenBLASCore() string {
	x := cpu.X86
	switch {
	case x.HasAVX512F && x.HasAVX512CD && x.HasAVX512BW && x.HasAVX512DQ && x.HasAVX512VL:
		return "SkylakeX"
	case x.HasAVX2 && x.HasFMA:
		return "Haswell"
	}
	return ""
}

// BetterOpenBLASCore returns the kernel set to ask OpenBLAS for when it
// detected detected on a processor whose best is best, "" when detected is
// as good (or either is unknown). OpenBLAS does not recognise some
// processors (virtual machines that report a generic model) and falls back
// to its Prescott kernels, SSE3 only, four times slower than the AVX-512
// ones the processor runs.
func BetterOpenBLASCore(detected, best string) string {
	d := strings.ToLower(strings.TrimSpace(detected))
	if d == "" || best == "" {
		return ""
	}
	switch best {
	case "SkylakeX":
		if !slices.Contains(openblasAVX512Cores, d) {
			return best
		}
	case "Haswell":
		if !slices.Contains(openblasAVX2Cores, d) {
			return best
		}
	}
	return ""
}
