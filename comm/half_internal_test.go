package comm

import (
	"math"
	"math/rand/v2"
	"sort"
	"testing"
)

// refRound is an independent reference for rounding a float32 to a 16-bit
// format: the nearest of the format's finite values (listed from its bit
// patterns, compared in float64, where every float32 and every difference
// between neighbours is exact), ties to the even bit pattern, and infinity
// from the largest finite value plus half a unit in its last place (IEEE
// 754's overflow rule).
type refFormat struct {
	name   string
	values []float64 // positive finite values, by bit pattern 0..maxFinite
	to     func(uint16) float32
	from   func(float32) uint16
}

func newRef(name string, maxFinite uint16, to func(uint16) float32, from func(float32) uint16) *refFormat {
	r := &refFormat{name: name, to: to, from: from}
	for h := uint16(0); h <= maxFinite; h++ {
		r.values = append(r.values, float64(to(h)))
	}
	return r
}

func (r *refFormat) round(f float32) uint16 {
	var sign uint16
	x := float64(f)
	if math.Signbit(x) {
		sign, x = 0x8000, -x
	}
	last := len(r.values) - 1
	top, below := r.values[last], r.values[last-1]
	switch {
	case x >= top+(top-below)/2:
		return sign | r.infBits()
	case x >= top:
		return sign | uint16(last)
	}
	i := sort.SearchFloat64s(r.values, x) // first value >= x
	if i < len(r.values) && r.values[i] == x {
		return sign | uint16(i)
	}
	lo, hi := i-1, i
	dl, dh := x-r.values[lo], r.values[hi]-x
	switch {
	case dl < dh:
		return sign | uint16(lo)
	case dh < dl:
		return sign | uint16(hi)
	case lo%2 == 0:
		return sign | uint16(lo)
	}
	return sign | uint16(hi)
}

var (
	f16Ref  = newRef("float16", 0x7bff, func(h uint16) float32 { return Float16(h).Float32() }, func(f float32) uint16 { return uint16(Float16From(f)) })
	bf16Ref = newRef("bfloat16", 0x7f7f, func(h uint16) float32 { return BFloat16(h).Float32() }, func(f float32) uint16 { return uint16(BFloat16From(f)) })
)

// infBits is the format's positive infinity: the pattern after the largest
// finite value.
func (r *refFormat) infBits() uint16 { return uint16(len(r.values)) }

func (r *refFormat) check(t *testing.T, f float32) {
	t.Helper()
	want := r.round(f)
	if got := r.from(f); got != want {
		t.Fatalf("%s(%g = %#08x) = %#04x, want %#04x", r.name, f, math.Float32bits(f), got, want)
	}
}

func TestHalfRoundsLikeTheReference(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for _, r := range []*refFormat{f16Ref, bf16Ref} {
		// every midpoint between neighbours, and the float32s next to it
		for h := 0; h+1 < len(r.values); h++ {
			a, b := r.values[h], r.values[h+1]
			mid := float32((a + b) / 2)
			for _, f := range []float32{mid, math.Nextafter32(mid, 0), math.Nextafter32(mid, float32(math.Inf(1))), float32(a), float32(b)} {
				r.check(t, f)
				r.check(t, -f)
			}
		}
		// the overflow boundary, and random float32s of every magnitude
		top := r.values[len(r.values)-1]
		edge := float32(top + (top-r.values[len(r.values)-2])/2)
		for _, f := range []float32{edge, math.Nextafter32(edge, 0), math.MaxFloat32, math.SmallestNonzeroFloat32, 1e-30} {
			r.check(t, f)
			r.check(t, -f)
		}
		for range 200000 {
			f := math.Float32frombits(rng.Uint32())
			if f != f || math.IsInf(float64(f), 0) {
				continue
			}
			r.check(t, f)
		}
	}
}

func TestHalfSpecialValues(t *testing.T) {
	inf := float32(math.Inf(1))
	for _, c := range []struct {
		f       float32
		f16, bf uint16
	}{
		{inf, 0x7c00, 0x7f80},
		{-inf, 0xfc00, 0xff80},
		{0, 0x0000, 0x0000},
		{float32(math.Copysign(0, -1)), 0x8000, 0x8000},
		{65504, 0x7bff, 0x4780},
		{65520, 0x7c00, 0x4780}, // float16 overflows at the halfway point
		{float32(math.Ldexp(1, -24)), 0x0001, 0x3380},
		{float32(math.Ldexp(1, -25)), 0x0000, 0x3300},      // tie to even: zero
		{float32(math.Ldexp(3, -26)), 0x0001, 0x3340},      // above the tie
		{float32(math.Ldexp(1023, -24)), 0x03ff, 0x3880},   // largest subnormal; bf16 rounds up
		{float32(math.Ldexp(2047, -25)), 0x0400, 0x3880},   // rounds up into the normals
		{math.Float32frombits(0x00000001), 0x0000, 0x0000}, // float32 subnormal
		{math.Float32frombits(0x00008000), 0x0000, 0x0000}, // bf16 tie to even: zero
		{math.Float32frombits(0x00018000), 0x0000, 0x0002}, // bf16 tie to even: up
		{math.Float32frombits(0x7fc00000), 0x7e00, 0x7fc0}, // quiet NaN
		{math.Float32frombits(0x7f800001), 0x7e00, 0x7fc0}, // signalling NaN, low payload
		{math.Float32frombits(0xffa00000), 0xff00, 0xffe0}, // signalling NaN, negative
		{math.Float32frombits(0x7fbfffff), 0x7fff, 0x7fff}, // payload kept, made quiet
		{0.1, 0x2e66, 0x3dcd},
	} {
		if got := uint16(Float16From(c.f)); got != c.f16 {
			t.Errorf("Float16From(%#08x) = %#04x, want %#04x", math.Float32bits(c.f), got, c.f16)
		}
		if got := uint16(BFloat16From(c.f)); got != c.bf {
			t.Errorf("BFloat16From(%#08x) = %#04x, want %#04x", math.Float32bits(c.f), got, c.bf)
		}
	}
}

// TestHalfRoundTripsEveryPattern widens every 16-bit pattern and rounds it
// back: finite values and infinities come back as they were, NaNs come back
// as the same NaN made quiet.
func TestHalfRoundTripsEveryPattern(t *testing.T) {
	for h := range 1 << 16 {
		u := uint16(h)
		if f := Float16(u).Float32(); f != f {
			if got := uint16(Float16From(f)); got != u|0x0200 {
				t.Fatalf("float16 NaN %#04x came back as %#04x", u, got)
			}
		} else if got := uint16(Float16From(f)); got != u {
			t.Fatalf("float16 %#04x -> %g -> %#04x", u, f, got)
		}
		if f := BFloat16(u).Float32(); f != f {
			if got := uint16(BFloat16From(f)); got != u|0x0040 {
				t.Fatalf("bfloat16 NaN %#04x came back as %#04x", u, got)
			}
		} else if got := uint16(BFloat16From(f)); got != u {
			t.Fatalf("bfloat16 %#04x -> %g -> %#04x", u, f, got)
		}
	}
	// widening is exact: float16 against its definition
	for h := range 1 << 16 {
		u := uint16(h)
		e, m := int(u>>10&0x1f), float64(u&0x3ff)
		var want float64
		switch e {
		case 0:
			want = math.Ldexp(m, -24)
		case 0x1f:
			continue
		default:
			want = math.Ldexp(1024+m, e-25)
		}
		if u&0x8000 != 0 {
			want = -want
		}
		if got := float64(Float16(u).Float32()); got != want {
			t.Fatalf("float16 %#04x widened to %g, want %g", u, got, want)
		}
	}
}

// TestHalfSliceConversions checks the slice conversions (F16C where the
// processor has it) against the scalar ones, bit for bit, on every 16-bit
// pattern and on float32s around every rounding boundary, at lengths that
// leave tails.
func TestHalfSliceConversions(t *testing.T) {
	all := make([]uint16, 1<<16)
	for i := range all {
		all[i] = uint16(i)
	}
	var fs []float32
	for _, r := range []*refFormat{f16Ref, bf16Ref} {
		for h := 0; h+1 < len(r.values); h++ {
			mid := float32((r.values[h] + r.values[h+1]) / 2)
			fs = append(fs, mid, -mid, math.Nextafter32(mid, 0), math.Nextafter32(mid, 1e9))
		}
	}
	rng := rand.New(rand.NewPCG(3, 4))
	for range 100000 {
		fs = append(fs, math.Float32frombits(rng.Uint32()))
	}
	check := func(t *testing.T) {
		wide := make([]float32, len(all))
		FromFloat16(wide, typed[Float16](asBytes(all)))
		for i, h := range all {
			if got, want := math.Float32bits(wide[i]), math.Float32bits(Float16(h).Float32()); got != want {
				t.Fatalf("FromFloat16 of %#04x = %#08x, want %#08x", h, got, want)
			}
		}
		for _, n := range []int{0, 1, 7, 8, 9, 31, len(fs)} {
			src := fs[len(fs)-n:]
			out := make([]Float16, n+3) // longer than src: only n are written
			if got := ToFloat16(out, src); got != n {
				t.Fatalf("ToFloat16 wrote %d of %d", got, n)
			}
			bo := make([]BFloat16, n)
			ToBFloat16(bo, src)
			for i, f := range src {
				if want := Float16From(f); out[i] != want {
					t.Fatalf("ToFloat16 of %#08x = %#04x, want %#04x", math.Float32bits(f), out[i], want)
				}
				if want := BFloat16From(f); bo[i] != want {
					t.Fatalf("ToBFloat16 of %#08x = %#04x, want %#04x", math.Float32bits(f), bo[i], want)
				}
			}
			if out[n] != 0 || out[n+2] != 0 {
				t.Fatalf("ToFloat16 wrote past %d elements", n)
			}
		}
		// the fused widen-and-add, on float32s of every kind
		for _, dt := range []dtype{dtFloat16, dtBFloat16} {
			acc := append([]float32(nil), fs[:len(all)]...)
			addWidenHalf(acc, asBytes(all), dt)
			for i, h := range all {
				w := Float16(h).Float32()
				if dt == dtBFloat16 {
					w = BFloat16(h).Float32()
				}
				want := fs[i] + w
				if got := acc[i]; math.Float32bits(got) != math.Float32bits(want) && !(got != got && want != want) {
					t.Fatalf("%v: %g + widen(%#04x) = %g, want %g", dt, fs[i], h, got, want)
				}
			}
		}
		bw := make([]float32, len(all))
		FromBFloat16(bw, typed[BFloat16](asBytes(all)))
		for i, h := range all {
			if got, want := math.Float32bits(bw[i]), math.Float32bits(BFloat16(h).Float32()); got != want {
				t.Fatalf("FromBFloat16 of %#04x = %#08x, want %#08x", h, got, want)
			}
		}
	}
	check(t)
	if useF16C {
		useF16C = false
		defer func() { useF16C = true }()
		check(t)
	}
}
