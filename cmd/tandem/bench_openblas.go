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
	"strings"
	"time"

	tblas "github.com/tandemml/tandem/internal/blas"
)

// openblasCoreEnv is the variable OpenBLAS reads to choose its kernels.
const openblasCoreEnv = tblas.CoreTypeEnv

// peerOpenBLASCore asks the peer's libblas.so.3 (OpenBLAS) which kernels it
// detects, the way Debian's torch loads it, and returns what to set
// OPENBLAS_CORETYPE to for the peer (with what OpenBLAS would run
// otherwise), or "" when the library is not OpenBLAS or its choice is as
// good as the processor allows. A caller's OPENBLAS_CORETYPE stands unless
// it names kernels slower than the processor's best: machine images set
// Haswell for processors OpenBLAS does not know, and on one with AVX-512
// (AMD Zen 5) the peer's step then took 8.6-8.9 ms against 5.8-6.0 ms with
// SkylakeX (torch_ddp.py 1, three runs each).
func peerOpenBLASCore(ctx context.Context) (set, detected string) {
	if v := os.Getenv(openblasCoreEnv); v != "" {
		detected = v + " (" + openblasCoreEnv + ", set by the caller)"
		return tblas.BetterOpenBLASCore(v, tblas.BestOpenBLASCore()), detected
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	const probe = "import ctypes\nl = ctypes.CDLL('libblas.so.3')\nl.openblas_get_corename.restype = ctypes.c_char_p\nprint(l.openblas_get_corename().decode())"
	out, err := exec.CommandContext(ctx, peerPython, "-c", probe).Output()
	if err != nil {
		return "", "" // not OpenBLAS (no openblas_get_corename), or no python
	}
	detected = strings.TrimSpace(string(out))
	return tblas.BetterOpenBLASCore(detected, tblas.BestOpenBLASCore()), detected
}
