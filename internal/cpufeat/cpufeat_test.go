package cpufeat

import (
	"os"
	"runtime"
	"strings"
	"testing"
)

// TestFMAAgreesWithTheKernel: on Linux/amd64 the answers (FMA, AVX512)
// match the flags the kernel lists in /proc/cpuinfo.
func TestFMAAgreesWithTheKernel(t *testing.T) {
	b, err := os.ReadFile("/proc/cpuinfo")
	if err != nil || runtime.GOARCH != "amd64" {
		t.Logf("FMA = %v (no /proc/cpuinfo to compare with on %s)", FMA, runtime.GOARCH)
		return
	}
	var flags []string
	for _, line := range strings.Split(string(b), "\n") {
		if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "flags" {
			flags = strings.Fields(v)
			break
		}
	}
	has := func(f string) bool {
		for _, x := range flags {
			if x == f {
				return true
			}
		}
		return false
	}
	want := has("avx") && has("fma")
	if purego {
		want = false
	}
	if FMA != want {
		t.Fatalf("FMA = %v, /proc/cpuinfo says avx %v fma %v", FMA, has("avx"), has("fma"))
	}
	// Linux lists avx512f only where it also saves the ZMM state.
	want512 := has("avx512f") && has("avx512vl") && !purego
	if AVX512 != want512 {
		t.Fatalf("AVX512 = %v, /proc/cpuinfo says avx512f %v avx512vl %v", AVX512, has("avx512f"), has("avx512vl"))
	}
}
