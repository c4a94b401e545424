package main

// OpenBLAS picks its kernels by recognising the processor. Where it does not
// (a virtual machine that reports a generic "Intel Xeon Processor", as these
// do), it falls back to its Prescott kernels, SSE3 only, and a matrix product
// takes about four times as long as on the AVX-512 kernels the processor can
// run. Tandem's -tags openblas build re-selects its kernels itself
// (internal/blas); a peer measured on the fallback would be handicapped, so
// the benchmarks name the peer's kernels and, unless OPENBLAS_CORETYPE is set
// already, run it on the best ones the processor has.

import (
	"context"
	"os"
	"os/exec"
	"slices"
	"strings"
	"time"

	"golang.org/x/sys/cpu"
)

// openblasCoreEnv is the environment variable OpenBLAS reads, once, when it
// is loaded, to choose its kernels instead of detecting the processor.
const openblasCoreEnv = "OPENBLAS_CORETYPE"

// openblasAVX512Cores and openblasAVX2Cores are OpenBLAS's x86-64 kernel
// sets that use AVX-512 and (at least) AVX2.
var (
	openblasAVX512Cores = []string{"skylakex", "cooperlake", "sapphirerapids"}
	openblasAVX2Cores   = []string{"haswell", "zen", "skylakex", "cooperlake", "sapphirerapids"}
)

// cpuBestOpenBLASCore is the best OpenBLAS kernel set this processor runs:
// SkylakeX with AVX-512 F, CD, BW, DQ and VL, Haswell with AVX2 and FMA, ""
// otherwise.
func cpuBestOpenBLASCore() string {
	x := cpu.X86
	switch {
	case x.HasAVX512F && x.HasAVX512CD && x.HasAVX512BW && x.HasAVX512DQ && x.HasAVX512VL:
		return "SkylakeX"
	case x.HasAVX2 && x.HasFMA:
		return "Haswell"
	}
	return ""
}

// betterOpenBLASCore returns the kernel set to ask OpenBLAS for when it
// detected detected on a processor whose best is best, "" when detected is as
// good (or either is unknown).
func betterOpenBLASCore(detected, best string) string {
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

// peerOpenBLASCore asks the peer's libblas.so.3 (OpenBLAS) which kernels it
// detects, the way Debian's torch loads it, and returns what to set
// OPENBLAS_CORETYPE to for the peer (with the detected name), or "" when the
// variable is set already (detected then says so), the library is not
// OpenBLAS, or its choice is as good as the processor allows.
func peerOpenBLASCore(ctx context.Context) (set, detected string) {
	if v := os.Getenv(openblasCoreEnv); v != "" {
		return "", v + " (" + openblasCoreEnv + ", set by the caller)"
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	const probe = "import ctypes\nl = ctypes.CDLL('libblas.so.3')\nl.openblas_get_corename.restype = ctypes.c_char_p\nprint(l.openblas_get_corename().decode())"
	out, err := exec.CommandContext(ctx, peerPython, "-c", probe).Output()
	if err != nil {
		return "", "" // not OpenBLAS (no openblas_get_corename), or no python
	}
	detected = strings.TrimSpace(string(out))
	return betterOpenBLASCore(detected, cpuBestOpenBLASCore()), detected
}
