package ddp

import (
	"context"
	"math"
	"sync"
	"testing"
	"time"

	"gorgonia.org/tensor"

	"github.com/tandemml/tandem/comm"
	"github.com/tandemml/tandem/comm/local"
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
		if got := float16.from(c.v); got != c.f16 {
			t.Errorf("float16(%v) = %#04x, want %#04x", c.v, got, c.f16)
		}
		if got := bfloat16.from(c.v); got != c.bf16 {
			t.Errorf("bfloat16(%v) = %#04x, want %#04x", c.v, got, c.bf16)
		}
	}
}

// TestCompressHookRoundsOnce runs the compression hooks on hand-made buckets
// over local worlds of 2 and 3 and checks every element bit for bit: each
// rank's value rounded to 16 bits and divided by the world size in 16 bits
// (as PyTorch's hooks do), then summed in float32 in rank order and rounded
// once. With two ranks that is also what rounding every partial sum gives
// (the hooks' results before they used the 16-bit all-reduce); with three,
// values are chosen where the two differ.
func TestCompressHookRoundsOnce(t *testing.T) {
	for _, f := range []halfFormat{float16, bfloat16} {
		for _, world := range []int{2, 3} {
			pgs, err := local.NewGroups(context.Background(), world, comm.WithTimeout(30*time.Second))
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			const numel = 5000 // several of the hook's blocks
			input := func(r, i int) float32 {
				x := uint32(r*7919+i*104729+1) * 2654435761
				return float32(int32(x>>8)) / (1 << 23) // in [-1, 1)
			}
			got := make([][]float32, world)
			errs := make([]error, world)
			var wg sync.WaitGroup
			for r := range world {
				wg.Add(1)
				go func() {
					defer wg.Done()
					d := make([]float32, numel)
					for i := range d {
						d[i] = input(r, i)
					}
					b := &GradBucket{buf: tensor.New(tensor.WithShape(numel), tensor.WithBacking(d))}
					out, err := compressHook(ctx, pgs[r], b, f).Wait(ctx)
					if err == nil {
						got[r] = out.Float32s()
					}
					errs[r] = err
				}()
			}
			wg.Wait()
			cancel()
			for _, pg := range pgs {
				pg.Close()
			}
			for r, err := range errs {
				if err != nil {
					t.Fatalf("%s world %d rank %d: %v", f.name, world, r, err)
				}
			}
			differs := 0
			for i := range numel {
				parts := make([]uint16, world)
				for r := range parts {
					parts[r] = f.from(f.to(f.from(input(r, i))) / float32(world))
				}
				acc := f.to(parts[0])
				hop := parts[0]
				for _, p := range parts[1:] {
					acc += f.to(p)
					hop = f.from(f.to(hop) + f.to(p))
				}
				want := f.to(f.from(acc))
				if f.to(hop) != want {
					differs++
					if world == 2 {
						t.Fatalf("%s: element %d: rounding once and per addition differ with two ranks", f.name, i)
					}
				}
				for r := range world {
					if got[r][i] != want {
						t.Fatalf("%s world %d rank %d element %d: %v, want %v", f.name, world, r, i, got[r][i], want)
					}
				}
			}
			if world == 3 && differs == 0 {
				t.Errorf("%s: no element where rounding once differs from rounding per addition: the test cannot tell them apart", f.name)
			}
		}
	}
}
