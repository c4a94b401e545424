package optim

import (
	"math"
	"math/big"
	"sync"
)

// cosPrec is the working precision, in bits, of cosRounded.
const cosPrec = 384

// halfPi is pi/2 to cosPrec+64 bits, computed once by Machin's formula
// pi = 16*atan(1/5) - 4*atan(1/239).
var halfPi = sync.OnceValue(func() *big.Float {
	prec := uint(cosPrec + 64)
	atanInv := func(n int64) *big.Float {
		// atan(1/n) = sum_k (-1)^k / ((2k+1) n^(2k+1))
		sum := new(big.Float).SetPrec(prec)
		pow := new(big.Float).SetPrec(prec).Quo(big.NewFloat(1).SetPrec(prec), new(big.Float).SetPrec(prec).SetInt64(n))
		n2 := new(big.Float).SetPrec(prec).SetInt64(n * n)
		term := new(big.Float).SetPrec(prec)
		eps := new(big.Float).SetPrec(prec).SetMantExp(big.NewFloat(1), -int(prec)-8)
		for k := int64(0); ; k++ {
			term.Quo(pow, new(big.Float).SetPrec(prec).SetInt64(2*k+1))
			if k%2 == 0 {
				sum.Add(sum, term)
			} else {
				sum.Sub(sum, term)
			}
			if term.Cmp(eps) < 0 {
				return sum
			}
			pow.Quo(pow, n2)
		}
	}
	pi := new(big.Float).SetPrec(prec).Mul(big.NewFloat(16), atanInv(5))
	pi.Sub(pi, new(big.Float).SetPrec(prec).Mul(big.NewFloat(4), atanInv(239)))
	return pi.Quo(pi, big.NewFloat(2))
})

// cosRounded returns cos(x) correctly rounded to float64. C's cos (which
// Python's math.cos and therefore torch's cosine schedule use) is correctly
// rounded except where the exact value lies very near halfway between two
// doubles (about 1 argument in 1000 in our tests, off by one ulp then); Go's
// math.Cos differs from it in the last bit for about a quarter of arguments. The argument is reduced modulo pi/2 and the Taylor series
// summed in big.Float at cosPrec bits; cost is tens of microseconds, which
// suits a call per epoch. Arguments beyond 2^60 in magnitude, NaN and
// infinities fall back to math.Cos.
func cosRounded(x float64) float64 {
	if math.IsNaN(x) || math.IsInf(x, 0) || math.Abs(x) > 0x1p60 {
		return math.Cos(x)
	}
	const prec = cosPrec
	hp := halfPi()
	X := new(big.Float).SetPrec(prec).SetFloat64(x)
	q := new(big.Float).SetPrec(prec).Quo(X, hp)
	// k = nearest integer to q
	qf, _ := q.Float64()
	k := int64(math.Round(qf))
	r := new(big.Float).SetPrec(prec).Mul(new(big.Float).SetPrec(prec).SetInt64(k), hp)
	r.Sub(X, r)
	var v *big.Float
	switch ((k % 4) + 4) % 4 {
	case 0:
		v = taylor(r, true)
	case 1:
		v = taylor(r, false)
		v.Neg(v)
	case 2:
		v = taylor(r, true)
		v.Neg(v)
	default:
		v = taylor(r, false)
	}
	f, _ := v.Float64()
	return f
}

// taylor sums the series of cos(r) (cos true) or sin(r) at cosPrec bits.
func taylor(r *big.Float, cos bool) *big.Float {
	const prec = cosPrec
	r2 := new(big.Float).SetPrec(prec).Mul(r, r)
	term := new(big.Float).SetPrec(prec).SetInt64(1)
	n := int64(0)
	if !cos {
		term.Set(r)
		n = 1
	}
	sum := new(big.Float).SetPrec(prec).Set(term)
	eps := new(big.Float).SetPrec(prec).SetMantExp(big.NewFloat(1), -prec-16)
	for {
		// term *= -r^2 / ((n+1)(n+2))
		term.Mul(term, r2)
		term.Quo(term, new(big.Float).SetPrec(prec).SetInt64((n+1)*(n+2)))
		term.Neg(term)
		n += 2
		sum.Add(sum, term)
		if new(big.Float).Abs(term).Cmp(eps) < 0 || term.Sign() == 0 {
			return sum
		}
	}
}
