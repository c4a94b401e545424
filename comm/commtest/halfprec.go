package commtest

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"strings"
	"testing"

	"gorgonia.org/tensor"

	"github.com/tandemml/tandem/comm"
)

// halfFormats are the 16-bit float dtypes with their conversions, as the
// tests use them: bits in and out of float32.
var halfFormats = []struct {
	name string
	dt   tensor.Dtype
	from func(float32) uint16
	to   func(uint16) float32
	// finite bit patterns whose float32 sums over up to maxWorld ranks the
	// generator draws from: exponents small enough that nothing overflows
	mask uint16
}{
	{"float16", comm.Float16Dtype,
		func(f float32) uint16 { return uint16(comm.Float16From(f)) },
		func(h uint16) float32 { return comm.Float16(h).Float32() }, 0x83ff},
	{"bfloat16", comm.BFloat16Dtype,
		func(f float32) uint16 { return uint16(comm.BFloat16From(f)) },
		func(h uint16) float32 { return comm.BFloat16(h).Float32() }, 0x807f},
}

// halfBits draws rank r's i-th value: a sign, an exponent near 1 (2^-3 to
// 2^4) and any significand, so that sums and products of a few stay finite
// and their float32 results usually need rounding to 16 bits.
func halfBits(dt tensor.Dtype, mask uint16, r, i int) uint16 {
	x := uint32(r*7919+i*104729+12345) * 2654435761
	x ^= x >> 15
	h := uint16(x) & mask
	e := uint16(x>>20) % 8 // 0..7
	if dt == comm.Float16Dtype {
		return h | (e+12)<<10 // exponents 12..19: 2^-3 .. 2^4
	}
	return h | (e+124)<<7
}

func halfTensor(dt tensor.Dtype, shape []int, f func(i int) uint16) *tensor.Dense {
	n := numel(shape)
	if dt == comm.Float16Dtype {
		d := make([]comm.Float16, n)
		for i := range d {
			d[i] = comm.Float16(f(i))
		}
		return tensor.New(tensor.WithShape(shape...), tensor.WithBacking(d))
	}
	d := make([]comm.BFloat16, n)
	for i := range d {
		d[i] = comm.BFloat16(f(i))
	}
	return tensor.New(tensor.WithShape(shape...), tensor.WithBacking(d))
}

// halfValues reads t's elements as bits, from its raw memory: gorgonia's
// Data() gives a scalar of a foreign type as its underlying kind and panics
// on an empty one.
func halfValues(t *tensor.Dense) []uint16 {
	if t.Dtype() != comm.Float16Dtype && t.Dtype() != comm.BFloat16Dtype {
		panic(fmt.Sprintf("commtest: %v is not a 16-bit float dtype", t.Dtype()))
	}
	out := make([]uint16, len(t.Raw)/2)
	for i := range out {
		out[i] = binary.NativeEndian.Uint16(t.Raw[2*i:])
	}
	return out
}

// halfReference is what a 16-bit reduction must give: the inputs widened to
// float32, combined in rank order in float32 (PremulSum scales each first,
// Avg divides the total), rounded once.
func halfReference(from func(float32) uint16, to func(uint16) float32, op comm.ReduceOp, inputs [][]uint16) []uint16 {
	n := len(inputs)
	out := make([]uint16, len(inputs[0]))
	for i := range out {
		w := func(r int) float32 {
			v := to(inputs[r][i])
			if op.Kind() == comm.KindPremulSum {
				v *= float32(op.Factor())
			}
			return v
		}
		acc := w(0)
		for r := 1; r < n; r++ {
			v := w(r)
			switch op.Kind() {
			case comm.KindProduct:
				acc *= v
			case comm.KindMin:
				acc = min(acc, v)
			case comm.KindMax:
				acc = max(acc, v)
			default:
				acc += v
			}
		}
		if op.Kind() == comm.KindAvg {
			acc /= float32(n)
		}
		out[i] = from(acc)
	}
	return out
}

func sameBits(a, b []uint16) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

var halfOps = []comm.ReduceOp{comm.Sum, comm.Avg, comm.Product, comm.Min, comm.Max, comm.PremulSum(0.375)}

// testHalfPrecision checks float16 and bfloat16 tensors in every collective:
// reductions bit-exact against the rounded-once reference, on both all-reduce
// algorithms and with chunks that split the buffers; the bitwise ops refused;
// data movement bit-exact; and a float16/bfloat16 disagreement reported as a
// mismatch naming both.
func (s *suite) testHalfPrecision(t *testing.T) {
	for _, alg := range algorithms {
		for _, n := range []int{1, 2, 3, 4} {
			t.Run(fmt.Sprintf("%s/n=%d", alg.name, n), func(t *testing.T) {
				ctx := testCtx(t)
				pgs := s.world(t, n, alg.opts...)
				mustEach(t, pgs, func(r int, pg *comm.ProcessGroup) error {
					for _, hf := range halfFormats {
						in := func(rank int) func(int) uint16 {
							return func(i int) uint16 { return halfBits(hf.dt, hf.mask, rank, i) }
						}
						for _, shape := range [][]int{{0}, {}, {1}, {37}, {2, 3}} {
							k := numel(shape)
							inputs := make([][]uint16, n)
							for q := range inputs {
								inputs[q] = fill(k, in(q))
							}
							for _, op := range halfOps {
								want := halfReference(hf.from, hf.to, op, inputs)
								x := halfTensor(hf.dt, shape, in(r))
								if err := pg.AllReduce(ctx, x, op).Wait(ctx); err != nil {
									return fmt.Errorf("all_reduce %s %v %v: %w", hf.name, shape, op, err)
								}
								if got := halfValues(x); !sameBits(got, want) {
									return fmt.Errorf("all_reduce %s %v %v: got %04x, want %04x", hf.name, shape, op, got, want)
								}
								root := (n - 1) / 2
								y := halfTensor(hf.dt, shape, in(r))
								if err := pg.Reduce(ctx, y, root, op).Wait(ctx); err != nil {
									return fmt.Errorf("reduce %s %v %v: %w", hf.name, shape, op, err)
								}
								wantY := want
								if r != root {
									wantY = inputs[r]
								}
								if got := halfValues(y); !sameBits(got, wantY) {
									return fmt.Errorf("reduce %s %v %v root %d: got %04x, want %04x", hf.name, shape, op, root, got, wantY)
								}
							}
							for _, op := range []comm.ReduceOp{comm.BAnd, comm.BOr, comm.BXor} {
								x := halfTensor(hf.dt, shape, in(r))
								if err := pg.AllReduce(ctx, x, op).Wait(ctx); !errors.Is(err, comm.ErrInvalidArgument) {
									return fmt.Errorf("all_reduce %s with %v: got %v, want ErrInvalidArgument", hf.name, op, err)
								}
							}
						}
						if err := halfScatterGather(ctx, pg, hf.dt, hf.from, hf.to, hf.mask, n, r); err != nil {
							return fmt.Errorf("%s: %w", hf.name, err)
						}
					}
					return nil
				})
			})
		}
	}
	t.Run("Large", s.testHalfLarge)
	t.Run("RoundedOnce", s.testHalfRoundedOnce)
	t.Run("Mismatch", s.testHalfMismatch)
}

// halfScatterGather checks reduce-scatter, all-reduce of coalesced tensors,
// broadcast and all-gather on 16-bit tensors.
func halfScatterGather(ctx context.Context, pg *comm.ProcessGroup, dt tensor.Dtype, from func(float32) uint16, to func(uint16) float32, mask uint16, n, r int) error {
	const per = 13
	in := func(rank int) func(int) uint16 {
		return func(i int) uint16 { return halfBits(dt, mask, rank, i) }
	}
	inputs := make([][]uint16, n)
	for q := range inputs {
		inputs[q] = fill(per*n, in(q))
	}
	for _, op := range halfOps {
		full := halfReference(from, to, op, inputs)
		out := halfTensor(dt, []int{per}, func(int) uint16 { return 0 })
		if err := pg.ReduceScatterTensor(ctx, out, halfTensor(dt, []int{per * n}, in(r)), op).Wait(ctx); err != nil {
			return fmt.Errorf("reduce_scatter_tensor %v: %w", op, err)
		}
		if got, want := halfValues(out), full[r*per:(r+1)*per]; !sameBits(got, want) {
			return fmt.Errorf("reduce_scatter_tensor %v: got %04x, want %04x", op, got, want)
		}
		// coalesced: three tensors cut from the same inputs
		cuts := []int{0, 5, per*n - 3, per * n}
		ts := make([]*tensor.Dense, len(cuts)-1)
		for j := range ts {
			lo := cuts[j]
			ts[j] = halfTensor(dt, []int{cuts[j+1] - lo}, func(i int) uint16 { return in(r)(lo + i) })
		}
		if err := pg.AllReduceCoalesced(ctx, ts, op).Wait(ctx); err != nil {
			return fmt.Errorf("all_reduce_coalesced %v: %w", op, err)
		}
		for j, x := range ts {
			if got, want := halfValues(x), full[cuts[j]:cuts[j+1]]; !sameBits(got, want) {
				return fmt.Errorf("all_reduce_coalesced %v tensor %d: got %04x, want %04x", op, j, got, want)
			}
		}
	}
	// data movement carries the bits as they are, NaN payloads included
	odd := func(rank int) func(int) uint16 {
		return func(i int) uint16 { return uint16(rank*977+i*31) ^ 0x7d01 }
	}
	b := halfTensor(dt, []int{per}, odd(r))
	if err := pg.Broadcast(ctx, b, n-1).Wait(ctx); err != nil {
		return fmt.Errorf("broadcast: %w", err)
	}
	if got, want := halfValues(b), fill(per, odd(n-1)); !sameBits(got, want) {
		return fmt.Errorf("broadcast: got %04x, want %04x", got, want)
	}
	outs := make([]*tensor.Dense, n)
	for q := range outs {
		outs[q] = halfTensor(dt, []int{per}, func(int) uint16 { return 0 })
	}
	if err := pg.AllGather(ctx, outs, halfTensor(dt, []int{per}, odd(r))).Wait(ctx); err != nil {
		return fmt.Errorf("all_gather: %w", err)
	}
	for q, o := range outs {
		if got, want := halfValues(o), fill(per, odd(q)); !sameBits(got, want) {
			return fmt.Errorf("all_gather block %d: got %04x, want %04x", q, got, want)
		}
	}
	return nil
}

// testHalfRoundedOnce pins the rounding: 1 + 2^-11 + 2^-11 over three ranks
// is 1 + 2^-10 in float16 when the sum is rounded once, and 1 when each
// partial sum is rounded (1 + 2^-11 is a tie that goes to the even 1, as
// gloo's ring would give); likewise for bfloat16 with 2^-8.
func (s *suite) testHalfRoundedOnce(t *testing.T) {
	for _, alg := range algorithms {
		t.Run(alg.name, func(t *testing.T) {
			ctx := testCtx(t)
			pgs := s.world(t, 3, alg.opts...)
			mustEach(t, pgs, func(r int, pg *comm.ProcessGroup) error {
				for _, hf := range halfFormats {
					ulp := float32(math.Ldexp(1, -10))
					if hf.dt == comm.BFloat16Dtype {
						ulp = float32(math.Ldexp(1, -7))
					}
					v := ulp / 2
					if r == 0 {
						v = 1
					}
					x := halfTensor(hf.dt, []int{64}, func(int) uint16 { return hf.from(v) })
					if err := pg.AllReduce(ctx, x, comm.Sum).Wait(ctx); err != nil {
						return err
					}
					want := hf.from(1 + ulp)
					for i, h := range halfValues(x) {
						if h != want {
							return fmt.Errorf("%s element %d: 1 + ulp/2 + ulp/2 gave %v (%#04x), want %v: partial sums were rounded", hf.name, i, hf.to(h), h, 1+ulp)
						}
					}
				}
				return nil
			})
		})
	}
}

// testHalfMismatch: ranks disagreeing on float16 against bfloat16 get
// ErrMismatch naming both dtypes, and the group goes on.
func (s *suite) testHalfMismatch(t *testing.T) {
	ctx := testCtx(t)
	pgs := s.world(t, 2)
	errs := each(pgs, func(r int, pg *comm.ProcessGroup) error {
		dt := comm.Float16Dtype
		if r == 1 {
			dt = comm.BFloat16Dtype
		}
		return pg.AllReduce(ctx, halfTensor(dt, []int{4}, func(i int) uint16 { return 0x3c00 }), comm.Sum).Wait(ctx)
	})
	for r, err := range errs {
		if !errors.Is(err, comm.ErrMismatch) {
			t.Errorf("rank %d got %v, want ErrMismatch", r, err)
			continue
		}
		for _, w := range []string{"all_reduce(float16,[4],sum)", "all_reduce(bfloat16,[4],sum)"} {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("rank %d's error does not name %q: %v", r, w, err)
			}
		}
	}
	mustEach(t, pgs, func(r int, pg *comm.ProcessGroup) error {
		x := halfTensor(comm.BFloat16Dtype, []int{2}, func(i int) uint16 { return 0x3f80 }) // 1.0
		if err := pg.AllReduce(ctx, x, comm.Sum).Wait(ctx); err != nil {
			return fmt.Errorf("after the mismatch: %w", err)
		}
		if got := halfValues(x); !sameBits(got, []uint16{0x4000, 0x4000}) {
			return fmt.Errorf("after the mismatch: got %04x, want 2.0s", got)
		}
		return nil
	})
}

// testHalfLarge reduces tensors large enough for several chunks on the ring
// and several blocks of the float32 fold, on both all-reduce paths.
func (s *suite) testHalfLarge(t *testing.T) {
	for _, alg := range []struct {
		name string
		opts []comm.Option
	}{
		{"direct", []comm.Option{comm.WithRingThreshold(1 << 30)}},
		{"ring", []comm.Option{comm.WithRingThreshold(0), comm.WithChunkSize(16 << 10)}},
	} {
		t.Run(alg.name, func(t *testing.T) {
			ctx := testCtx(t)
			const n, k = 3, 40001
			pgs := s.world(t, n, alg.opts...)
			mustEach(t, pgs, func(r int, pg *comm.ProcessGroup) error {
				for _, hf := range halfFormats {
					in := func(rank int) func(int) uint16 {
						return func(i int) uint16 { return halfBits(hf.dt, hf.mask, rank, i) }
					}
					inputs := make([][]uint16, n)
					for q := range inputs {
						inputs[q] = fill(k, in(q))
					}
					for _, op := range []comm.ReduceOp{comm.Sum, comm.Max, comm.PremulSum(-1.5)} {
						want := halfReference(hf.from, hf.to, op, inputs)
						x := halfTensor(hf.dt, []int{k}, in(r))
						if err := pg.AllReduce(ctx, x, op).Wait(ctx); err != nil {
							return fmt.Errorf("all_reduce %s %v: %w", hf.name, op, err)
						}
						if got := halfValues(x); !sameBits(got, want) {
							for i := range got {
								if got[i] != want[i] {
									return fmt.Errorf("all_reduce %s %v: element %d is %#04x, want %#04x", hf.name, op, i, got[i], want[i])
								}
							}
						}
					}
				}
				return nil
			})
		})
	}
}
