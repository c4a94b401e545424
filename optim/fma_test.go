package optim

import (
	"math"
	"math/big"
	"math/rand/v2"
	"testing"
)

// exactFMA32 is the float32 fused multiply-add rounded once, computed exactly
// with big floats: the reference for the vector kernels.
func exactFMA32(a, b, c float32) float32 {
	if math.IsNaN(float64(a)) || math.IsNaN(float64(b)) || math.IsNaN(float64(c)) ||
		math.IsInf(float64(a), 0) || math.IsInf(float64(b), 0) || math.IsInf(float64(c), 0) {
		return float32(float64(a)*float64(b) + float64(c)) // exact enough: no rounding question
	}
	x := new(big.Float).SetPrec(300).SetFloat64(float64(a))
	x.Mul(x, new(big.Float).SetFloat64(float64(b)))
	x.Add(x, new(big.Float).SetFloat64(float64(c)))
	f, _ := x.Float32()
	if f == 0 && math.Signbit(float64(a*b)) && math.Signbit(float64(c)) {
		return float32(math.Copysign(0, -1))
	}
	return f
}

func randFloats(rng *rand.Rand, n int) []float32 {
	x := make([]float32, n)
	for i := range x {
		switch rng.IntN(50) {
		case 0:
			x[i] = float32(math.Inf(1 - 2*rng.IntN(2)))
		case 1:
			x[i] = float32(math.NaN())
		case 2:
			x[i] = math.Float32frombits(rng.Uint32() & 0x807fffff) // subnormal
		case 3:
			x[i] = 0
		default:
			x[i] = float32(rng.NormFloat64() * math.Pow(2, float64(rng.IntN(40)-20)))
		}
	}
	return x
}

func sameBits(a, b float32) bool {
	if a != a && b != b {
		return true
	}
	return math.Float32bits(a) == math.Float32bits(b)
}

// TestFMA32: the portable float32 fused multiply-add is the exactly rounded
// one, on random operands over a wide range of exponents and on the cases
// where rounding through float64 goes wrong.
func TestFMA32(t *testing.T) {
	rng := rand.New(rand.NewPCG(11, 12))
	a, b, c := randFloats(rng, 200000), randFloats(rng, 200000), randFloats(rng, 200000)
	// Sums that land on a float32 halfway point in float64 with a tiny
	// remainder below: 1 + 2^-24 + 2^-60 must round up to 1 + 2^-23.
	a = append(a, 1, 1, -1)
	b = append(b, 1+0x1p-24, 0x1p-60, 1+0x1p-24)
	c = append(c, 0x1p-60, 1+0x1p-24, -0x1p-60)
	for i := range a {
		if got, want := fma32(a[i], b[i], c[i]), exactFMA32(a[i], b[i], c[i]); !sameBits(got, want) {
			t.Fatalf("fma32(%g, %g, %g) = %g, want %g", a[i], b[i], c[i], got, want)
		}
	}
}

// TestSGDKernelsRoundOnce: the float32 SGD updates, vectorized where the
// processor allows, equal the exactly rounded fused multiply-adds element
// for element, over lengths that exercise every tail, and NaN, infinities,
// zeros and subnormals.
func TestSGDKernelsRoundOnce(t *testing.T) {
	rng := rand.New(rand.NewPCG(9, 10))
	t.Logf("vector kernels: %v", sgdPlain32(nil, nil, 0, 0, false))
	lengths := []int{0, 1, 7, 8, 9, 15, 16, 17, 31, 33, 1000, 4099}
	for _, n := range lengths {
		p, g := randFloats(rng, n), randFloats(rng, n+3)
		a := float32(-0.01 * (1 + rng.Float64()))
		want := make([]float32, n)
		for i := range want {
			want[i] = exactFMA32(a, g[i], p[i])
		}
		plainSGD(p, g[:n], float64(a))
		for i := range p {
			if !sameBits(p[i], want[i]) {
				t.Fatalf("plain n=%d [%d]: fma(%v, %v, ·) = %v, want %v", n, i, a, g[i], p[i], want[i])
			}
		}

		for _, wd := range []float32{0, 1e-4} {
			// weight decay without momentum
			p, g = randFloats(rng, n), randFloats(rng, n)
			negLR := float32(-0.05)
			want := make([]float32, n)
			for i := range p {
				d := g[i]
				if wd != 0 {
					d = exactFMA32(wd, p[i], d)
				}
				want[i] = exactFMA32(negLR, d, p[i])
			}
			sgdKernel(p, g, nil, false, sgdConsts{negLR: float64(negLR), weightDecay: float64(wd)})
			for i := range p {
				if !sameBits(p[i], want[i]) {
					t.Fatalf("wd %v n=%d [%d]: p %v, want %v", wd, n, i, p[i], want[i])
				}
			}

			// momentum, with and without weight decay
			p, g = randFloats(rng, n), randFloats(rng, n)
			buf := randFloats(rng, n)
			const mom, damp = 0.9, 0.75
			wantP, wantB := make([]float32, n), make([]float32, n)
			for i := range p {
				d := g[i]
				if wd != 0 {
					d = exactFMA32(wd, p[i], d)
				}
				wantB[i] = exactFMA32(damp, d, buf[i]*mom)
				wantP[i] = exactFMA32(negLR, wantB[i], p[i])
			}
			sgdKernel(p, g, buf, false, sgdConsts{negLR: float64(negLR), momentum: mom, oneMinusDampening: damp, weightDecay: float64(wd)})
			for i := range p {
				if !sameBits(buf[i], wantB[i]) || !sameBits(p[i], wantP[i]) {
					t.Fatalf("momentum wd %v n=%d [%d]: p %v buf %v, want %v and %v", wd, n, i, p[i], buf[i], wantP[i], wantB[i])
				}
			}
		}
	}
}

// TestAdamKernelRoundsAsTorch: the float32 Adam and AdamW update, vectorized
// where the processor allows, follows torch's operation order with each
// operation rounded once, element for element, over every tail length and
// special values.
func TestAdamKernelRoundsAsTorch(t *testing.T) {
	rng := rand.New(rand.NewPCG(13, 14))
	sqrt32 := func(x float32) float32 { return float32(math.Sqrt(float64(x))) }
	for mode := 0; mode < 3; mode++ { // Adam, AdamW, Adam with L2 decay
		decoupled, l2 := mode == 1, mode == 2
		for _, n := range []int{0, 1, 7, 8, 9, 17, 1000, 4099} {
			p, g, m := randFloats(rng, n), randFloats(rng, n), randFloats(rng, n)
			v := randFloats(rng, n)
			for i := range v {
				v[i] = float32(math.Abs(float64(v[i]))) // a second moment is not negative
			}
			c := adamConsts{decay: 1 - 1e-3*0.01, beta1: 0.9, oneMinusBeta1: 1 - 0.9, beta2: 0.999, oneMinusBeta2: 1 - 0.999,
				negStepSize: -1e-3 / (1 - 0.9*0.9), bc2Sqrt: math.Sqrt(1 - 0.999*0.999), eps: 1e-8, decoupled: decoupled}
			if l2 {
				c.weightDecay, c.l2 = 0.01, true
			}
			decay, b1, omb1, b2, omb2 := float32(c.decay), float32(c.beta1), float32(c.oneMinusBeta1), float32(c.beta2), float32(c.oneMinusBeta2)
			negStep, bc2s, eps := float32(c.negStepSize), float32(c.bc2Sqrt), float32(c.eps)
			wp, wm, wv := make([]float32, n), make([]float32, n), make([]float32, n)
			for i := range p {
				pi, gi := p[i], g[i]
				if decoupled {
					pi *= decay
				}
				if l2 {
					gi = exactFMA32(float32(c.weightDecay), pi, gi)
				}
				wm[i] = exactFMA32(omb1, gi, m[i]*b1)
				wv[i] = exactFMA32(omb2*gi, gi, v[i]*b2)
				denom := sqrt32(wv[i])/bc2s + eps
				wp[i] = pi + negStep*wm[i]/denom
			}
			adamKernel(p, g, m, v, nil, c)
			for i := range p {
				if !sameBits(p[i], wp[i]) || !sameBits(m[i], wm[i]) || !sameBits(v[i], wv[i]) {
					t.Fatalf("mode %d n=%d [%d]: p %v m %v v %v, want %v %v %v", mode, n, i, p[i], m[i], v[i], wp[i], wm[i], wv[i])
				}
			}
		}
	}
}
