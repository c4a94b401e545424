package comm

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
)

// specials are values whose sums and products exercise rounding, overflow,
// underflow and NaN propagation.
var specials = []float64{0, math.Copysign(0, -1), 1, -1, math.MaxFloat32, -math.MaxFloat32, 1e-40, -1e-45,
	math.SmallestNonzeroFloat64, math.MaxFloat64, math.Inf(1), math.Inf(-1), math.NaN(), 0.1, 3}

func randomFloats(rng *rand.Rand, n int) []float64 {
	out := make([]float64, n)
	for i := range out {
		if rng.IntN(4) == 0 {
			out[i] = specials[rng.IntN(len(specials))]
		} else {
			out[i] = rng.NormFloat64() * math.Pow(10, float64(rng.IntN(20)-10))
		}
	}
	return out
}

// The vector loops give bit for bit what the scalar loops give, for every
// length (so every tail) and every offset.
func TestVectorKernelsMatchScalar(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for n := 0; n < 70; n++ {
		for _, off := range []int{0, 1, 3} {
			a64, b64 := randomFloats(rng, n+off), randomFloats(rng, n+off)
			a32, b32 := make([]float32, n+off), make([]float32, n+off)
			for i := range a32 {
				a32[i], b32[i] = float32(a64[i]), float32(b64[i])
			}
			check32 := func(name string, vec func(d, s []float32), scalar func(d, s []float32)) {
				got, want := append([]float32(nil), a32[off:]...), append([]float32(nil), a32[off:]...)
				vec(got, b32[off:])
				scalar(want, b32[off:])
				for i := range got {
					if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
						t.Fatalf("%s n=%d off=%d [%d]: %v op %v = %v, want %v", name, n, off, i, a32[off+i], b32[off+i], got[i], want[i])
					}
				}
			}
			check64 := func(name string, vec func(d, s []float64), scalar func(d, s []float64)) {
				got, want := append([]float64(nil), a64[off:]...), append([]float64(nil), a64[off:]...)
				vec(got, b64[off:])
				scalar(want, b64[off:])
				for i := range got {
					if math.Float64bits(got[i]) != math.Float64bits(want[i]) {
						t.Fatalf("%s n=%d off=%d [%d]: %v op %v = %v, want %v", name, n, off, i, a64[off+i], b64[off+i], got[i], want[i])
					}
				}
			}
			check32("addF32", addF32, func(d, s []float32) { reduceFloat(d, s, KindSum) })
			check32("mulF32", mulF32, func(d, s []float32) { reduceFloat(d, s, KindProduct) })
			check64("addF64", addF64, func(d, s []float64) { reduceFloat(d, s, KindSum) })
			check64("mulF64", mulF64, func(d, s []float64) { reduceFloat(d, s, KindProduct) })
		}
	}
	// A source longer than the destination is read only as far as dst goes.
	d, s := []float32{1, 2}, []float32{10, 20, 30}
	addF32(d, s)
	if d[0] != 11 || d[1] != 22 {
		t.Errorf("got %v", d)
	}
}

// BenchmarkReduceInto reduces a 512 KiB chunk into each part of a 16 MiB
// buffer in turn, as a ring's reduce-scatter does.
func BenchmarkReduceInto(b *testing.B) {
	const chunk, total = 512 << 10, 16 << 20
	dst, src := make([]byte, total), make([]byte, chunk)
	for _, dt := range []dtype{dtFloat32, dtFloat64, dtInt32} {
		b.Run(fmt.Sprint(dt), func(b *testing.B) {
			b.SetBytes(chunk)
			off := 0
			for b.Loop() {
				reduceInto(dst[off:off+chunk], src, dt, KindSum)
				off = (off + chunk) % total
			}
		})
	}
}

// TestStreamsResult: a staged all-reduce streams its result from 32 MiB a
// tensor, or from 64 MiB of the ranks' tensors together.
func TestStreamsResult(t *testing.T) {
	for _, c := range []struct {
		n, size int
		want    bool
	}{
		{2, 16 << 20, false},
		{2, 32 << 20, true},
		{4, 8 << 20, false},
		{4, 16<<20 - 4, false},
		{4, 16 << 20, true},
		{8, 8 << 20, true},
		{1, 32 << 20, true},
	} {
		if got := streamsResult(c.n, c.size); got != c.want {
			t.Errorf("streamsResult(%d, %d) = %v, want %v", c.n, c.size, got, c.want)
		}
	}
}

// TestStreamsStaging: staged copies go around the caches once one round's
// blocks of every rank reach 64 MiB together: four crowded ranks' blocks,
// not two ranks' cache-sized ones.
func TestStreamsStaging(t *testing.T) {
	for _, c := range []struct {
		n, block int
		want     bool
	}{
		{2, 2 << 20, false},
		{4, 2 << 20, false},
		{4, 8 << 20, false},
		{4, 16<<20 - 4, false},
		{4, 16 << 20, true},
		{4, crowdedStageBlock, true},
		{2, crowdedStageBlock, true},
	} {
		if got := streamsStaging(c.n, c.block); got != c.want {
			t.Errorf("streamsStaging(%d, %d) = %v, want %v", c.n, c.block, got, c.want)
		}
	}
}

// TestCopyStream: copyStream copies exactly, for lengths around its
// thresholds and destinations at every alignment.
func TestCopyStream(t *testing.T) {
	src := make([]byte, 100003+64)
	for i := range src {
		src[i] = byte(i*7 + i>>8)
	}
	for _, n := range []int{0, 1, 63, 4095, 4096, 4097, 4160, 100003} {
		for off := range 18 {
			dst := make([]byte, n+off+8)
			copyStream(dst[off:off+n], src[off:off+n])
			for i := range dst {
				want := byte(0)
				if i >= off && i < off+n {
					want = src[i]
				}
				if dst[i] != want {
					t.Fatalf("length %d at offset %d: byte %d = %d, want %d", n, off, i, dst[i], want)
				}
			}
		}
	}
}

// TestReduceFrom: three float32 sources a pass (addF32x3) give what three
// passes give, bit for bit, for every length and offset; and reduceFrom
// with any number of sources matches reduceInto on each in turn.
func TestReduceFrom(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	for n := 0; n < 70; n++ {
		for _, off := range []int{0, 1, 3} {
			for nsrc := 0; nsrc <= 7; nsrc++ {
				dst64 := randomFloats(rng, n+off)
				dst := make([]float32, n+off)
				for i := range dst {
					dst[i] = float32(dst64[i])
				}
				srcs := make([][]byte, nsrc)
				want := append([]float32(nil), dst[off:]...)
				for s := range srcs {
					v := randomFloats(rng, n+off)
					f := make([]float32, n+off)
					for i := range f {
						f[i] = float32(v[i])
					}
					srcs[s] = asBytes(f[off:])
					reduceFloat(want, f[off:], KindSum)
				}
				got := append([]float32(nil), dst[off:]...)
				reduceFrom(asBytes(got), srcs, dtFloat32, KindSum)
				for i := range got {
					if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
						t.Fatalf("n=%d off=%d sources=%d [%d]: got %v, want %v", n, off, nsrc, i, got[i], want[i])
					}
				}
			}
		}
	}
}
