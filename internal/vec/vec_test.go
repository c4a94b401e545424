package vec

import (
	"math"
	"math/rand/v2"
	"testing"
)

// specials are the values whose bits the kernels must treat as Go does.
var specials = []float32{0, float32(math.Copysign(0, -1)), 1, -1, float32(math.NaN()), float32(math.Inf(1)), float32(math.Inf(-1)), math.SmallestNonzeroFloat32, -math.SmallestNonzeroFloat32, math.MaxFloat32}

// operands returns n values, a third of them special, at an offset of off
// elements into their slice (so that the kernels see unaligned memory).
func operands(rng *rand.Rand, n, off int) []float32 {
	s := make([]float32, n+off)[off:]
	for i := range s {
		if rng.IntN(3) == 0 {
			s[i] = specials[rng.IntN(len(specials))]
		} else {
			s[i] = float32(rng.NormFloat64())
		}
	}
	return s
}

func sameBits(t *testing.T, name string, n, off int, got, want []float32) {
	t.Helper()
	for i := range want {
		if got[i] != got[i] && want[i] != want[i] {
			continue // NaNs: their payloads may differ
		}
		if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
			t.Fatalf("%s, %d elements at offset %d: element %d is %v (%#08x), want %v (%#08x)", name, n, off, i, got[i], math.Float32bits(got[i]), want[i], math.Float32bits(want[i]))
		}
	}
}

// TestKernels: every kernel against its plain loop, bit for bit, over
// lengths on both sides of the vector width, unaligned slices and special
// values; the element past len(x) stays untouched.
func TestKernels(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	binary := []struct {
		name string
		f    func(dst, x, y []float32)
		ref  func(x, y float32) float32
	}{
		{"Add", Add, func(x, y float32) float32 { return x + y }},
		{"Mul", Mul, func(x, y float32) float32 { return x * y }},
		{"AddReLU", AddReLU, func(x, y float32) float32 { return max(x+y, 0) }},
		{"ReLUMask", ReLUMask, func(x, dy float32) float32 {
			if x > 0 {
				return dy
			}
			return 0
		}},
	}
	for _, n := range []int{0, 1, 7, 8, 9, 15, 16, 17, 31, 64, 100, 1027} {
		for _, off := range []int{0, 1, 3} {
			x, y := operands(rng, n, off), operands(rng, n, off)
			for _, k := range binary {
				dst := make([]float32, n+1)
				dst[n] = 42
				k.f(dst, x, y)
				want := make([]float32, n)
				for i := range want {
					want[i] = k.ref(x[i], y[i])
				}
				sameBits(t, k.name, n, off, dst[:n], want)
				if dst[n] != 42 {
					t.Fatalf("%s, %d elements: wrote past them", k.name, n)
				}
			}
			acc := operands(rng, n+1, off)
			want := make([]float32, n)
			for i := range want {
				want[i] = acc[i] + x[i]
			}
			last := acc[n]
			AddTo(acc, x)
			sameBits(t, "AddTo", n, off, acc[:n], want)
			if math.Float32bits(acc[n]) != math.Float32bits(last) {
				t.Fatalf("AddTo, %d elements: wrote past them", n)
			}
		}
	}
}

// TestReLUEdges pins the cases where a vector max or compare could differ
// from Go: a NaN sum, a sum of -0, a NaN input to the mask.
func TestReLUEdges(t *testing.T) {
	nan, negZero := float32(math.NaN()), float32(math.Copysign(0, -1))
	x := make([]float32, 16)
	y := make([]float32, 16)
	x[0], y[0] = nan, 1
	x[1], y[1] = negZero, negZero
	x[2], y[2] = -3, 2
	x[3], y[3] = 2, -3
	dst := make([]float32, 16)
	AddReLU(dst, x, y)
	if !math.IsNaN(float64(dst[0])) {
		t.Errorf("AddReLU(NaN + 1) = %v, want NaN", dst[0])
	}
	if math.Float32bits(dst[1]) != 0 {
		t.Errorf("AddReLU(-0 + -0) = %v (bits %#08x), want +0", dst[1], math.Float32bits(dst[1]))
	}
	if dst[2] != 0 || dst[3] != 0 {
		t.Errorf("AddReLU of negative sums = %v, %v, want 0, 0", dst[2], dst[3])
	}
	dy := []float32{5, 6, 7, 8, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1}
	ReLUMask(dst, x, dy)
	if dst[0] != 0 || dst[1] != 0 || dst[2] != 0 || dst[3] != 8 {
		t.Errorf("ReLUMask(x = NaN, -0, -3, 2) = %v, want 0 0 0 8", dst[:4])
	}
}

func BenchmarkAddReLU(b *testing.B) {
	x, y, dst := make([]float32, 1024), make([]float32, 1024), make([]float32, 1024)
	b.SetBytes(3 * 4 * 1024)
	for b.Loop() {
		AddReLU(dst, x, y)
	}
}
