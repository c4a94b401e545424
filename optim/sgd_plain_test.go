package optim

import (
	"math"
	"math/rand/v2"
	"testing"
)

// TestPlainSGDRounding pins the fast path's arithmetic: the learning rate is
// rounded to the element type first (as torch rounds alpha to the tensor's
// dtype) and the update is rounded once.
func TestPlainSGDRounding(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	const lr = 0.1 // not representable: float32(0.1) != 0.1
	p32 := make([]float32, 1000)
	g32 := make([]float32, 1000)
	p64 := make([]float64, 1000)
	g64 := make([]float64, 1000)
	for i := range p32 {
		p32[i], g32[i] = float32(rng.NormFloat64()), float32(rng.NormFloat64())
		p64[i], g64[i] = rng.NormFloat64(), rng.NormFloat64()
	}
	want32 := make([]float32, len(p32))
	a := float32(-lr)
	for i := range p32 {
		want32[i] = exactFMA32(a, g32[i], p32[i])
	}
	want64 := make([]float64, len(p64))
	for i := range p64 {
		want64[i] = math.FMA(-lr, g64[i], p64[i])
	}
	plainSGD(p32, g32, -lr)
	plainSGD(p64, g64, -lr)
	for i := range p32 {
		if p32[i] != want32[i] {
			t.Fatalf("float32 element %d: %v, want %v", i, p32[i], want32[i])
		}
		if p64[i] != want64[i] {
			t.Fatalf("float64 element %d: %v, want %v", i, p64[i], want64[i])
		}
	}
}
