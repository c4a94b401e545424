package comm

import (
	"math"
	"math/rand/v2"
	"testing"
)

// TestAddLoopsAgree: the SSE2 and the AVX additions (whichever addF32 and
// addF64 do not pick on this processor is otherwise never run) give the
// scalar loop's bits, for every length and offset.
func TestAddLoopsAgree(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	for n := 0; n < 140; n++ {
		for _, off := range []int{0, 1, 3} {
			a64, b64 := randomFloats(rng, n+off), randomFloats(rng, n+off)
			a32, b32 := make([]float32, n+off), make([]float32, n+off)
			for i := range a32 {
				a32[i], b32[i] = float32(a64[i]), float32(b64[i])
			}
			want32 := append([]float32(nil), a32[off:]...)
			reduceFloat(want32, b32[off:], KindSum)
			want64 := append([]float64(nil), a64[off:]...)
			reduceFloat(want64, b64[off:], KindSum)
			loops32 := map[string]func(d, s []float32){"sse": addF32SSE}
			loops64 := map[string]func(d, s []float64){"sse": addF64SSE}
			if haveAVX {
				loops32["avx"], loops64["avx"] = addF32AVX, addF64AVX
			}
			for name, f := range loops32 {
				got := append([]float32(nil), a32[off:]...)
				f(got, b32[off:])
				for i := range got {
					if math.Float32bits(got[i]) != math.Float32bits(want32[i]) {
						t.Fatalf("float32 %s n=%d off=%d [%d]: got %v, want %v", name, n, off, i, got[i], want32[i])
					}
				}
			}
			for name, f := range loops64 {
				got := append([]float64(nil), a64[off:]...)
				f(got, b64[off:])
				for i := range got {
					if math.Float64bits(got[i]) != math.Float64bits(want64[i]) {
						t.Fatalf("float64 %s n=%d off=%d [%d]: got %v, want %v", name, n, off, i, got[i], want64[i])
					}
				}
			}
		}
	}
}
