package ddp

import (
	"math"
	"testing"
)

func TestHalfRoundTripsEveryValue(t *testing.T) {
	for _, f := range []halfFormat{float16, bfloat16} {
		for h := 0; h < 1<<16; h++ {
			v := f.to(uint16(h))
			if v != v { // NaN: stays NaN
				if back := f.to(f.from(v)); back == back {
					t.Fatalf("%s: NaN %#04x came back as %v", f.name, h, back)
				}
				continue
			}
			if got := f.from(v); got != uint16(h) {
				t.Fatalf("%s: %#04x -> %v -> %#04x", f.name, h, v, got)
			}
		}
	}
}

func TestHalfRoundsToNearestEven(t *testing.T) {
	for _, f := range []halfFormat{float16, bfloat16} {
		// between every pair of neighbours (finite, positive), the midpoint
		// goes to the even one and points just off it to the nearer one
		limit := uint16(0x7bff)
		if f.name == "bfloat16" {
			limit = 0x7f7f
		}
		for h := uint16(0); h < limit; h++ {
			a, b := float64(f.to(h)), float64(f.to(h+1))
			mid := float32((a + b) / 2)
			if float64(mid) != (a+b)/2 {
				continue // midpoint not representable in float32
			}
			even := h
			if h&1 == 1 {
				even = h + 1
			}
			if got := f.from(mid); got != even {
				t.Fatalf("%s: midpoint of %#04x and %#04x (%v) -> %#04x, want %#04x", f.name, h, h+1, mid, got, even)
			}
			below := math.Nextafter32(mid, float32(a))
			above := math.Nextafter32(mid, float32(b))
			if got := f.from(below); got != h {
				t.Fatalf("%s: just below the midpoint of %#04x and %#04x -> %#04x", f.name, h, h+1, got)
			}
			if got := f.from(above); got != h+1 {
				t.Fatalf("%s: just above the midpoint of %#04x and %#04x -> %#04x", f.name, h, h+1, got)
			}
		}
	}
}

// TestHalfKnownValues compares with what PyTorch 1.13 gives for
// torch.tensor([v]).to(torch.float16 / torch.bfloat16).
func TestHalfKnownValues(t *testing.T) {
	cases := []struct {
		v    float32
		f16  uint16
		bf16 uint16
	}{
		{1, 0x3c00, 0x3f80},
		{-2, 0xc000, 0xc000},
		{65504, 0x7bff, 0x4780},
		{65520, 0x7c00, 0x4780}, // rounds up to infinity in float16
		{1e-8, 0x0000, 0x322c},  // below half of float16's smallest subnormal
		{float32(math.Ldexp(1, -24)), 0x0001, 0x3380},
		{float32(math.Inf(-1)), 0xfc00, 0xff80},
		{0.1, 0x2e66, 0x3dcd},
	}
	for _, c := range cases {
		if got := f32ToF16(c.v); got != c.f16 {
			t.Errorf("float16(%v) = %#04x, want %#04x", c.v, got, c.f16)
		}
		if got := f32ToBF16(c.v); got != c.bf16 {
			t.Errorf("bfloat16(%v) = %#04x, want %#04x", c.v, got, c.bf16)
		}
	}
}
