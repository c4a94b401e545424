//go:build linux

package comm_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"unsafe"

	"gorgonia.org/tensor"

	"github.com/tandemml/tandem/comm"
	"github.com/tandemml/tandem/comm/commtest"
	"github.com/tandemml/tandem/comm/local"
	"github.com/tandemml/tandem/comm/shm"
	"github.com/tandemml/tandem/comm/transport"
)

// wantReduced is what an all-reduce with op of fill's values gives at
// element i, in a world of n ranks.
func wantReduced(op comm.ReduceOp, dt tensor.Dtype, n, i int) float64 {
	sum, mx := 0.0, 0.0
	for q := 0; q < n; q++ {
		v := float64((q + 1) * (i%7 + 1))
		sum += v
		mx = max(mx, v)
	}
	switch op {
	case comm.Sum:
		return sum
	case comm.Max:
		return mx
	case comm.Avg:
		if dt == tensor.Int64 {
			return float64(int64(sum) / int64(n))
		}
		return sum / float64(n)
	}
	return 0.5 * sum // PremulSum(0.5)
}

// TestStagedAllReduce: all-reduces of ordinary tensors on groups whose
// ranks share a host go through the staging segment: whole below the ring
// threshold, by blocks above it (a tensor of several blocks and a ragged
// end), for several worlds, dtypes and ops. Every element is right on
// every rank, and only fingerprints go through the transport.
func TestStagedAllReduce(t *testing.T) {
	for _, c := range []struct {
		name   string
		inner  transport.Backend
		worlds []int
	}{{"shm", shm.NewBackend(shm.WithRingBytes(256 << 10)), []int{2, 3, 4}}, {"local", local.Backend{}, []int{3}}} {
		for _, n := range c.worlds {
			t.Run(fmt.Sprintf("%s/world%d", c.name, n), func(t *testing.T) {
				var sent atomic.Int64
				pgs := commtest.Groups(t, commtest.Counting(c.inner, &sent), n)
				ctx := shortCtx(t)
				for _, size := range []struct {
					elems int
					dts   []tensor.Dtype
					ops   []comm.ReduceOp
				}{
					{1001, []tensor.Dtype{tensor.Float32, tensor.Float64, tensor.Int64}, nil},      // whole
					{40003, []tensor.Dtype{tensor.Float32, tensor.Int64}, nil},                     // one block
					{1100003, []tensor.Dtype{tensor.Float32}, []comm.ReduceOp{comm.Sum, comm.Avg}}, // 4.2 MB: three blocks, the last short
				} {
					for _, dt := range size.dts {
						ops := size.ops
						if ops == nil {
							ops = []comm.ReduceOp{comm.Sum, comm.Max, comm.Avg}
							if dt != tensor.Int64 {
								ops = append(ops, comm.PremulSum(0.5))
							}
						}
						xs := make([]*tensor.Dense, n)
						for r := range xs {
							xs[r] = tensor.New(tensor.Of(dt), tensor.WithShape(size.elems))
						}
						for _, op := range ops {
							for r, x := range xs {
								fill(x, r)
							}
							before := sent.Load()
							for r, err := range eachRank(pgs, func(r int, pg *comm.ProcessGroup) error {
								return pg.AllReduce(ctx, xs[r], op).Wait(ctx)
							}) {
								if err != nil {
									t.Fatalf("%d %v %v rank %d: %v", size.elems, dt, op, r, err)
								}
							}
							if moved := sent.Load() - before; moved > int64(n*n*1024) {
								t.Errorf("%d %v %v: the ranks sent %d bytes through the transport", size.elems, dt, op, moved)
							}
							for r, x := range xs {
								for i := 0; i < size.elems; i += 1 + i/3 {
									if got, want := at(x, i), wantReduced(op, dt, n, i); got != want {
										t.Fatalf("%d %v %v rank %d element %d = %v, want %v", size.elems, dt, op, r, i, got, want)
									}
								}
								if got, want := at(x, size.elems-1), wantReduced(op, dt, n, size.elems-1); got != want {
									t.Fatalf("%d %v %v rank %d last element = %v, want %v", size.elems, dt, op, r, got, want)
								}
							}
						}
					}
				}
			})
		}
	}
}

// allReduceFilled all-reduces with Sum, on every rank, a new tensor of dt
// and elems elements holding fill's values, and returns the ranks'
// tensors; what names the case in a failure.
func allReduceFilled(t *testing.T, ctx context.Context, pgs []*comm.ProcessGroup, dt tensor.Dtype, elems int, what string) []*tensor.Dense {
	t.Helper()
	xs := make([]*tensor.Dense, len(pgs))
	for r, err := range eachRank(pgs, func(r int, pg *comm.ProcessGroup) error {
		xs[r] = tensor.New(tensor.Of(dt), tensor.WithShape(elems))
		fill(xs[r], r)
		return pg.AllReduce(ctx, xs[r], comm.Sum).Wait(ctx)
	}) {
		if err != nil {
			t.Fatalf("%s: rank %d: %v", what, r, err)
		}
	}
	return xs
}

// checkSummed all-reduces float64 tensors of elems elements filled by fill
// with Sum on every rank, and checks each rank's last element.
func checkSummed(t *testing.T, ctx context.Context, pgs []*comm.ProcessGroup, elems int, what string) {
	t.Helper()
	for r, x := range allReduceFilled(t, ctx, pgs, tensor.Float64, elems, what) {
		if got, want := at(x, elems-1), wantReduced(comm.Sum, tensor.Float64, len(pgs), elems-1); got != want {
			t.Fatalf("%s: rank %d's last element = %v, want %v", what, r, got, want)
		}
	}
}

// TestStagedAllReduceLarge: tensors large enough that the result is
// written around the caches (32 MiB and a ragged end; 16 MiB and a ragged
// end on four ranks, 64 MiB together) are right everywhere, in the
// machine's blocks for two and four ranks and in the crowded block (two
// rounds, the last short).
func TestStagedAllReduceLarge(t *testing.T) {
	const large, together = 8<<20 + 3, 4<<20 + 3
	for _, c := range []struct {
		name    string
		n       int
		elems   int
		crowded bool
	}{{"world2", 2, large, false}, {"world4", 4, large, false}, {"world4/crowded", 4, large, true}, {"world4/16MiB", 4, together, false}} {
		t.Run(c.name, func(t *testing.T) {
			if c.crowded {
				t.Cleanup(comm.SetStageBlockSource(func() int { return comm.CrowdedStageBlock }))
			}
			pgs := commtest.Groups(t, local.Backend{}, c.n)
			xs := allReduceFilled(t, shortCtx(t), pgs, tensor.Float32, c.elems, c.name)
			if c.crowded {
				if got := comm.StageBlock(pgs[0]); got != comm.CrowdedStageBlock {
					t.Fatalf("staged in blocks of %d bytes, want %d", got, comm.CrowdedStageBlock)
				}
			}
			ranks := c.n * (c.n + 1) / 2 // fill's factors summed
			for r, x := range xs {
				for i, v := range x.Float32s() {
					if want := float32(ranks * (i%7 + 1)); v != want {
						t.Fatalf("rank %d element %d = %v, want %v", r, i, v, want)
					}
				}
			}
		})
	}
}

// TestStagedReduceCrowded: a reduce in the crowded block, whose staged
// copies go around the caches (streamsStaging), scales the non-roots'
// staged copies of a premultiplied sum and leaves their tensors alone.
func TestStagedReduceCrowded(t *testing.T) {
	const n, elems, root = 4, 8<<20 + 3, 1
	t.Cleanup(comm.SetStageBlockSource(func() int { return comm.CrowdedStageBlock }))
	pgs := commtest.Groups(t, local.Backend{}, n)
	ctx := shortCtx(t)
	op := comm.PremulSum(0.5)
	xs := make([]*tensor.Dense, n)
	for r, err := range eachRank(pgs, func(r int, pg *comm.ProcessGroup) error {
		xs[r] = tensor.New(tensor.Of(tensor.Float32), tensor.WithShape(elems))
		fill(xs[r], r)
		return pg.Reduce(ctx, xs[r], root, op).Wait(ctx)
	}) {
		if err != nil {
			t.Fatalf("rank %d: %v", r, err)
		}
	}
	if got := comm.StageBlock(pgs[0]); got != comm.CrowdedStageBlock {
		t.Fatalf("staged in blocks of %d bytes, want %d", got, comm.CrowdedStageBlock)
	}
	for r, x := range xs {
		for i, v := range x.Float32s() {
			want := float64((r + 1) * (i%7 + 1))
			if r == root {
				want = wantReduced(op, tensor.Float32, n, i)
			}
			if float64(v) != want {
				t.Fatalf("rank %d element %d = %v, want %v", r, i, v, want)
			}
		}
	}
}

// TestStagedAllReduceBits: float sums whose order matters (values of
// mixed magnitudes) come out with the same bits on every rank, whole and
// by blocks, and match the transport's algorithms to rounding.
func TestStagedAllReduceBits(t *testing.T) {
	const n = 3
	for _, elems := range []int{999, 600001} {
		results := make([][][]float32, 2) // [staged?][rank]
		for run, staged := range []bool{false, true} {
			pgs := commtest.Groups(t, local.Backend{}, n, comm.WithStaging(staged))
			ctx := shortCtx(t)
			results[run] = make([][]float32, n)
			for r, err := range eachRank(pgs, func(r int, pg *comm.ProcessGroup) error {
				d := make([]float32, elems)
				for i := range d {
					d[i] = float32(math.Pow(10, float64((i+r)%9-4))) * float32(1+i%5)
				}
				results[run][r] = d
				return pg.AllReduce(ctx, tensor.New(tensor.WithShape(elems), tensor.WithBacking(d)), comm.Sum).Wait(ctx)
			}) {
				if err != nil {
					t.Fatalf("%d elements, staged %v, rank %d: %v", elems, staged, r, err)
				}
			}
		}
		for r := 1; r < n; r++ {
			for i, v := range results[1][r] {
				if math.Float32bits(v) != math.Float32bits(results[1][0][i]) {
					t.Fatalf("%d elements: rank %d element %d = %v, rank 0 has %v: the ranks differ", elems, r, i, v, results[1][0][i])
				}
			}
		}
		for i, v := range results[1][0] {
			if w := results[0][0][i]; math.Abs(float64(v-w)) > 1e-6*math.Abs(float64(w)) {
				t.Fatalf("%d elements: element %d staged %v, through the transport %v", elems, i, v, w)
			}
		}
	}
}

// TestStagedMismatch: a collective on which the ranks disagree while
// others stage (another length, or another collective) fails with
// ErrMismatch on every rank, and the group's next staged all-reduces, whole
// and by blocks, are right again: nothing of the failed one is left out of
// step.
func TestStagedMismatch(t *testing.T) {
	const n, big = 3, 700001
	pgs := commtest.Groups(t, local.Backend{}, n)
	ctx := shortCtx(t)
	check := func(what string, elems int) { t.Helper(); checkSummed(t, ctx, pgs, elems, what) }
	check("first", big) // maps the staging segment
	for _, c := range []struct {
		name string
		odd  func(pg *comm.ProcessGroup) comm.Work // rank 2's call
	}{
		{"length", func(pg *comm.ProcessGroup) comm.Work {
			return pg.AllReduce(ctx, tensor.New(tensor.Of(tensor.Float64), tensor.WithShape(big/3)), comm.Sum)
		}},
		{"collective", func(pg *comm.ProcessGroup) comm.Work {
			return pg.Broadcast(ctx, tensor.New(tensor.Of(tensor.Float64), tensor.WithShape(big)), 0)
		}},
		{"whole", func(pg *comm.ProcessGroup) comm.Work {
			return pg.AllReduce(ctx, tensor.New(tensor.Of(tensor.Float64), tensor.WithShape(10)), comm.Sum)
		}},
	} {
		for r, err := range eachRank(pgs, func(r int, pg *comm.ProcessGroup) error {
			if r == 2 {
				return c.odd(pg).Wait(ctx)
			}
			return pg.AllReduce(ctx, tensor.New(tensor.Of(tensor.Float64), tensor.WithShape(big)), comm.Sum).Wait(ctx)
		}) {
			if !errors.Is(err, comm.ErrMismatch) {
				t.Fatalf("%s: rank %d: got %v, want ErrMismatch", c.name, r, err)
			}
		}
		check("after "+c.name+", whole", 7)
		check("after "+c.name+", by blocks", big)
	}
}

// TestStagingOff: WithStaging(false), or a transport that does not say
// its ranks share a host, sends all-reduces through the transport.
func TestStagingOff(t *testing.T) {
	const n, elems = 2, 100000
	for _, c := range []struct {
		name  string
		inner transport.Backend
		opts  []comm.Option
	}{{"option", local.Backend{}, []comm.Option{comm.WithStaging(false)}}, {"hidden host", hiddenHost{local.Backend{}}, nil}} {
		var sent atomic.Int64
		pgs := commtest.Groups(t, commtest.Counting(c.inner, &sent), n, c.opts...)
		allReduceFilled(t, shortCtx(t), pgs, tensor.Float32, elems, c.name)
		if moved := sent.Load(); moved < 4*elems {
			t.Errorf("%s: the ranks sent %d bytes; the all-reduce did not go through the transport", c.name, moved)
		}
	}
}

// TestStagingLeavesNothing: the staging segment's file has no name once
// every rank mapped it, and Close unmaps it.
func TestStagingLeavesNothing(t *testing.T) {
	before := tandemSegments(t)
	mapped := stagingMappings(t)
	pgs := commtest.Groups(t, shm.NewBackend(shm.WithRingBytes(256<<10)), 2)
	ctx := shortCtx(t)
	for r, err := range eachRank(pgs, func(r int, pg *comm.ProcessGroup) error {
		return pg.AllReduce(ctx, tensor.New(tensor.Of(tensor.Float32), tensor.WithShape(100000)), comm.Sum).Wait(ctx)
	}) {
		if err != nil {
			t.Fatalf("rank %d: %v", r, err)
		}
	}
	// Only this process's segments count: other packages' tests, in other
	// processes, make and unlink theirs meanwhile.
	maps, err := os.ReadFile("/proc/self/maps")
	if err != nil {
		t.Skipf("no /proc/self/maps: %v", err)
	}
	for name := range tandemSegments(t) {
		if !before[name] && strings.Contains(string(maps), name) {
			t.Errorf("%s is still in /dev/shm after every rank mapped it", name)
		}
	}
	if got := stagingMappings(t); got != mapped+2 {
		t.Errorf("the process maps %d segments of shared tensors and staging, %d before the all-reduce; want 2 more (a rank each)", got, mapped)
	}
	for _, pg := range pgs {
		if err := pg.Close(); err != nil {
			t.Fatal(err)
		}
	}
	if got := stagingMappings(t); got != mapped {
		t.Errorf("after Close the process maps %d segments of shared tensors and staging, %d before", got, mapped)
	}
}

// stagingMappings counts this process's mappings of shared tensors' and
// staging segments.
func stagingMappings(t *testing.T) int {
	t.Helper()
	b, err := os.ReadFile("/proc/self/maps")
	if err != nil {
		t.Skipf("no /proc/self/maps: %v", err)
	}
	return strings.Count(string(b), "/tandem-tensor-")
}

// tandemSegments returns the names of Tandem's segments in /dev/shm.
func tandemSegments(t *testing.T) map[string]bool {
	t.Helper()
	ents, err := os.ReadDir("/dev/shm")
	if err != nil {
		t.Skipf("no /dev/shm: %v", err)
	}
	names := map[string]bool{}
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), "tandem-") {
			names[e.Name()] = true
		}
	}
	return names
}

// TestStagedCollectives: broadcasts, reduces, gathers, all-gathers and
// reduce-scatters on
// groups whose ranks share a host go through the staging segment, in
// several rounds for tensors larger than a buffer: every element is right
// on every rank, the inputs are left alone, and only fingerprints go
// through the transport.
func TestStagedCollectives(t *testing.T) {
	for _, n := range []int{2, 3, 4} {
		t.Run(fmt.Sprintf("world%d", n), func(t *testing.T) {
			var sent atomic.Int64
			pgs := commtest.Groups(t, commtest.Counting(shm.NewBackend(shm.WithRingBytes(256<<10)), &sent), n)
			ctx := shortCtx(t)
			const elems = 700001 // 2.8 MB of float32: two rounds and a ragged end
			check := func(what string, x *tensor.Dense, want func(i int) float64) {
				t.Helper()
				d := x.Float32s()
				for i := 0; i < len(d); i += 1 + i/5 {
					if float64(d[i]) != want(i) {
						t.Fatalf("%s: element %d = %v, want %v", what, i, d[i], want(i))
					}
				}
				if i := len(d) - 1; float64(d[i]) != want(i) {
					t.Fatalf("%s: last element %d = %v, want %v", what, i, d[i], want(i))
				}
			}
			value := func(r, i int) float64 { return float64((r + 1) * (i%7 + 1)) }
			run := func(what string, f func(r int, pg *comm.ProcessGroup) error) {
				t.Helper()
				before := sent.Load()
				for r, err := range eachRank(pgs, f) {
					if err != nil {
						t.Fatalf("%s: rank %d: %v", what, r, err)
					}
				}
				if moved := sent.Load() - before; moved > int64(n*n*1024) {
					t.Errorf("%s: the ranks sent %d bytes through the transport", what, moved)
				}
			}
			newFilled := func(r, elems int) *tensor.Dense {
				x := tensor.New(tensor.Of(tensor.Float32), tensor.WithShape(elems))
				fill(x, r)
				return x
			}

			root := n - 1
			xs := make([]*tensor.Dense, n)
			run("broadcast", func(r int, pg *comm.ProcessGroup) error {
				xs[r] = newFilled(r, elems)
				return pg.Broadcast(ctx, xs[r], root).Wait(ctx)
			})
			for r, x := range xs {
				check(fmt.Sprintf("broadcast, rank %d", r), x, func(i int) float64 { return value(root, i) })
			}

			outs := make([][]*tensor.Dense, n)
			run("all_gather", func(r int, pg *comm.ProcessGroup) error {
				outs[r] = make([]*tensor.Dense, n)
				for p := range outs[r] {
					outs[r][p] = tensor.New(tensor.Of(tensor.Float32), tensor.WithShape(elems))
				}
				return pg.AllGather(ctx, outs[r], newFilled(r, elems)).Wait(ctx)
			})
			for r := range outs {
				for p, x := range outs[r] {
					check(fmt.Sprintf("all_gather, rank %d, outs[%d]", r, p), x, func(i int) float64 { return value(p, i) })
				}
			}

			// Reduce into a root that is neither the first nor the last
			// rank (for n > 2); the other ranks' tensors stay as they were.
			for _, op := range []comm.ReduceOp{comm.Sum, comm.Max, comm.Avg, comm.PremulSum(0.5)} {
				root := 1
				run(fmt.Sprintf("reduce %v", op), func(r int, pg *comm.ProcessGroup) error {
					xs[r] = newFilled(r, elems)
					return pg.Reduce(ctx, xs[r], root, op).Wait(ctx)
				})
				for r, x := range xs {
					want := func(i int) float64 { return value(r, i) }
					if r == root {
						want = func(i int) float64 { return wantReduced(op, tensor.Float32, n, i) }
					}
					check(fmt.Sprintf("reduce %v, rank %d", op, r), x, want)
				}
			}

			// Gather into a root that is neither the first nor the last
			// rank (for n > 2).
			gathered := make([]*tensor.Dense, n)
			run("gather", func(r int, pg *comm.ProcessGroup) error {
				var outs []*tensor.Dense
				if r == 1 {
					outs = make([]*tensor.Dense, n)
					for p := range outs {
						outs[p] = tensor.New(tensor.Of(tensor.Float32), tensor.WithShape(elems))
					}
					copy(gathered, outs)
				}
				return pg.Gather(ctx, outs, newFilled(r, elems), 1).Wait(ctx)
			})
			for p, x := range gathered {
				check(fmt.Sprintf("gather, outs[%d]", p), x, func(i int) float64 { return value(p, i) })
			}

			// Block q of rank r holds value(r, q*elems+i): rank q gets
			// their sum (or average) over the ranks.
			for _, op := range []comm.ReduceOp{comm.Sum, comm.Avg, comm.PremulSum(0.5)} {
				ins := make([]*tensor.Dense, n)
				run(fmt.Sprintf("reduce_scatter %v", op), func(r int, pg *comm.ProcessGroup) error {
					ins[r] = newFilled(r, n*elems)
					xs[r] = tensor.New(tensor.Of(tensor.Float32), tensor.WithShape(elems))
					return pg.ReduceScatterTensor(ctx, xs[r], ins[r], op).Wait(ctx)
				})
				for r, x := range xs {
					check(fmt.Sprintf("reduce_scatter %v, rank %d", op, r), x, func(i int) float64 {
						return wantReduced(op, tensor.Float32, n, r*elems+i)
					})
					check(fmt.Sprintf("reduce_scatter %v, rank %d's input", op, r), ins[r], func(i int) float64 { return value(r, i) })
				}
			}
		})
	}
}

// BenchmarkStagedCollectives times each collective of 16 MiB a rank (a
// broadcast's or a reduce's tensor, a gather's or an all-gather's input, a
// reduce-scatter's output) among four goroutine ranks over the shm backend,
// through the staging segment and through the transport, interleaved.
func BenchmarkStagedCollectives(b *testing.B) {
	const n, elems = 4, 4 << 20
	for _, coll := range []string{"broadcast", "reduce", "gather", "all_gather", "reduce_scatter", "all_reduce"} {
		for _, staged := range []bool{true, false} {
			b.Run(fmt.Sprintf("%s/staged=%v", coll, staged), func(b *testing.B) {
				pgs := commtest.Groups(b, shm.NewBackend(), n, comm.WithStaging(staged))
				ctx := context.Background()
				xs := make([]*tensor.Dense, n)
				bigs := make([]*tensor.Dense, n)
				parts := make([]*tensor.Dense, n) // root 0's gather outputs
				for r := range n {
					xs[r] = tensor.New(tensor.Of(tensor.Float32), tensor.WithShape(elems))
					bigs[r] = tensor.New(tensor.Of(tensor.Float32), tensor.WithShape(n*elems))
					parts[r] = tensor.New(tensor.Of(tensor.Float32), tensor.WithShape(elems))
				}
				rootParts := func(r int) []*tensor.Dense {
					if r == 0 {
						return parts
					}
					return nil
				}
				op := func(r int, pg *comm.ProcessGroup) error {
					switch coll {
					case "broadcast":
						return pg.Broadcast(ctx, xs[r], 0).Wait(ctx)
					case "reduce":
						return pg.Reduce(ctx, xs[r], 0, comm.Sum).Wait(ctx)
					case "gather":
						return pg.Gather(ctx, rootParts(r), xs[r], 0).Wait(ctx)
					case "all_gather":
						return pg.AllGatherIntoTensor(ctx, bigs[r], xs[r]).Wait(ctx)
					case "reduce_scatter":
						return pg.ReduceScatterTensor(ctx, xs[r], bigs[r], comm.Sum).Wait(ctx)
					}
					return pg.AllReduce(ctx, xs[r], comm.Sum).Wait(ctx)
				}
				b.SetBytes(4 * elems)
				for b.Loop() {
					for r, err := range eachRank(pgs, op) {
						if err != nil {
							b.Fatalf("rank %d: %v", r, err)
						}
					}
				}
			})
		}
	}
}

// TestStagedHalf: float16 and bfloat16 all-reduces, reduce-scatters and
// reduces staged (whole and by blocks) give bit for bit what the transport's
// algorithms give: both widen to float32, combine in rank order and round
// once.
func TestStagedHalf(t *testing.T) {
	const n = 3
	for _, dt := range []tensor.Dtype{comm.Float16Dtype, comm.BFloat16Dtype} {
		for _, elems := range []int{1001, 1500007} {
			for _, op := range []comm.ReduceOp{comm.Sum, comm.Avg, comm.Max, comm.PremulSum(0.25)} {
				results := make([][][]uint16, 2) // [staged?][rank] all-reduce, reduce-scatter, then reduce
				for run, staged := range []bool{false, true} {
					pgs := commtest.Groups(t, local.Backend{}, n, comm.WithStaging(staged))
					ctx := shortCtx(t)
					results[run] = make([][]uint16, n)
					for r, err := range eachRank(pgs, func(r int, pg *comm.ProcessGroup) error {
						bits := make([]uint16, elems)
						for i := range bits {
							// Values of mixed magnitudes and signs, finite in
							// both formats.
							bits[i] = uint16((i*2654435761+r*40503)>>7) & 0x3bff
							if dt == comm.BFloat16Dtype {
								bits[i] = uint16((i*2654435761+r*40503)>>7) & 0x3f7f
							}
							if (i+r)%3 == 0 {
								bits[i] |= 0x8000
							}
						}
						in := append([]uint16(nil), bits...)
						x := tensor.New(tensor.WithShape(elems), tensor.Of(dt), tensor.WithBacking(halfBacking(dt, bits)))
						if err := pg.AllReduce(ctx, x, op).Wait(ctx); err != nil {
							return err
						}
						per := elems / n
						out := make([]uint16, per)
						y := tensor.New(tensor.WithShape(per), tensor.Of(dt), tensor.WithBacking(halfBacking(dt, out)))
						whole := tensor.New(tensor.WithShape(per*n), tensor.Of(dt), tensor.WithBacking(halfBacking(dt, in[:per*n])))
						if err := pg.ReduceScatterTensor(ctx, y, whole, op).Wait(ctx); err != nil {
							return err
						}
						// A reduce into rank 1 of the original values.
						red := append([]uint16(nil), in...)
						z := tensor.New(tensor.WithShape(elems), tensor.Of(dt), tensor.WithBacking(halfBacking(dt, red)))
						if err := pg.Reduce(ctx, z, 1, op).Wait(ctx); err != nil {
							return err
						}
						results[run][r] = append(append(bits, out...), red...)
						return nil
					}) {
						if err != nil {
							t.Fatalf("%v %d %v staged %v rank %d: %v", dt, elems, op, staged, r, err)
						}
					}
				}
				for r := range n {
					for i, v := range results[1][r] {
						if w := results[0][r][i]; v != w {
							t.Fatalf("%v %d %v rank %d element %d: staged %04x, through the transport %04x", dt, elems, op, r, i, v, w)
						}
					}
				}
			}
		}
	}
}

// halfBacking returns bits as the backing slice of a tensor of dtype dt.
func halfBacking(dt tensor.Dtype, bits []uint16) any {
	if dt == comm.Float16Dtype {
		return unsafe.Slice((*comm.Float16)(unsafe.Pointer(&bits[0])), len(bits))
	}
	return unsafe.Slice((*comm.BFloat16)(unsafe.Pointer(&bits[0])), len(bits))
}

// TestStageBlockAgreed: every member stages with rank 0's block, which only
// rank 0 asks its machine for, and the all-reduce by those blocks is right.
func TestStageBlockAgreed(t *testing.T) {
	calls := 0
	t.Cleanup(comm.SetStageBlockSource(func() int {
		calls++
		if calls > 1 {
			return 1 << 20 // a member that asked its own machine would differ
		}
		return 384 << 10
	}))
	const n, elems = 3, 700003 // 2.8 MB, past a buffer's 2 MiB: several blocks, the last short
	pgs := flightWorld(t, n)
	ctx := shortCtx(t)
	xs := make([][]float32, n)
	errs := make(chan error, n)
	for r := range n {
		go func() {
			xs[r] = make([]float32, elems)
			for i := range xs[r] {
				xs[r][i] = float32(r + i%5)
			}
			x := tensor.New(tensor.WithShape(elems), tensor.WithBacking(xs[r]))
			errs <- pgs[r].AllReduce(ctx, x, comm.Sum).Wait(ctx)
		}()
	}
	for range n {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	for r, pg := range pgs {
		if got := comm.StageBlock(pg); got != 384<<10 {
			t.Fatalf("rank %d stages with blocks of %d bytes, want 384 KiB", r, got)
		}
		for i, v := range xs[r] {
			if want := float32(3 + 3*(i%5)); v != want {
				t.Fatalf("rank %d element %d = %v, want %v", r, i, v, want)
			}
		}
	}
	if calls != 1 {
		t.Fatalf("the machine's block was asked %d times, want once (rank 0)", calls)
	}
}
