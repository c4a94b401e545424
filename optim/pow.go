package optim

import "math"

// powInt returns x**n rounded to nearest, as C's pow (which Python's ** and
// therefore torch.optim's bias corrections use) returns it. Go's math.Pow
// multiplies out integer powers in float64 and may be off by an ulp or more;
// here the power is built by repeated squaring in double-double arithmetic
// (about 104 significant bits) and rounded once, which is correctly rounded
// except when the exact power lies within ~2^-80 relative of a rounding
// boundary.
func powInt(x float64, n int64) float64 {
	if n < 0 {
		return 1 / powInt(x, -n)
	}
	if n == 0 {
		return 1
	}
	if x == 0 || math.IsNaN(x) || math.IsInf(x, 0) {
		return math.Pow(x, float64(n))
	}
	rh, rl := 1.0, 0.0
	bh, bl := x, 0.0
	for m := n; ; {
		if m&1 == 1 {
			rh, rl = ddMul(rh, rl, bh, bl)
		}
		m >>= 1
		if m == 0 {
			break
		}
		bh, bl = ddMul(bh, bl, bh, bl)
	}
	r := rh + rl
	if r == 0 || math.IsInf(r, 0) || math.Abs(r) < 0x1p-969 {
		// Out of double-double's exact range: near underflow the error terms
		// are no longer representable; fall back to the library power.
		return math.Pow(x, float64(n))
	}
	return r
}

// ddMul multiplies two double-double numbers (hi+lo) and renormalises.
func ddMul(ah, al, bh, bl float64) (float64, float64) {
	p := ah * bh
	e := math.FMA(ah, bh, -p)
	e += float64(ah*bl) + float64(al*bh)
	s := p + e
	return s, e - (s - p)
}
