package commtest

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/tandemml/tandem/comm"
	"gorgonia.org/tensor"
)

// algorithms are the option sets that steer all-reduce onto each of its
// algorithms, with chunks small enough that the pipelines really pipeline.
// On backends whose ranks share a host, "staged" runs every all-reduce
// through the staging segment by blocks and "staged-whole" every one
// through it whole (below the ring threshold); elsewhere both are the
// transport's algorithms under their thresholds.
var algorithms = []struct {
	name string
	opts []comm.Option
}{
	{"doubling", []comm.Option{comm.WithStaging(false), comm.WithRingThreshold(1 << 30)}},
	{"ring", []comm.Option{comm.WithStaging(false), comm.WithRingThreshold(0), comm.WithChunkSize(8)}},
	{"staged", []comm.Option{comm.WithRingThreshold(0)}},
	{"staged-whole", nil},
}

// stagings run a collective other than all-reduce through the transport
// and, on backends whose ranks share a host, through the staging segment
// (elsewhere both are the transport's algorithms), with chunks small
// enough that the pipelines really pipeline.
var stagings = []struct {
	name string
	opts []comm.Option
}{
	{"transport", []comm.Option{comm.WithStaging(false), comm.WithChunkSize(8)}},
	{"staged", []comm.Option{comm.WithChunkSize(8)}},
}

// shapes include an empty tensor, a scalar, sizes not divisible by the world
// size and a matrix.
var shapes = [][]int{{0}, {}, {1}, {7}, {37}, {2, 3}}

const maxWorld = 5

func (s *suite) testAllReduce(t *testing.T) {
	s.eachVariant(t, algorithms, func(ctx context.Context, n, r int, pg *comm.ProcessGroup) error {
		for _, dt := range dtypes {
			ok, refused := opsFor(dt)
			for _, shape := range shapes {
				for _, op := range ok {
					x := newTensor(dt, shape, func(i int) int64 { return val(r, i) })
					if err := pg.AllReduce(ctx, x, op).Wait(ctx); err != nil {
						return fmt.Errorf("all_reduce %v %v %v: %w", dt, shape, op, err)
					}
					want := expected(dt, op, inputsOf(n, 0, numel(shape)))
					if got := values(x); !equal(got, want) {
						return fmt.Errorf("all_reduce %v %v %v: got %v, want %v", dt, shape, op, got, want)
					}
				}
				for _, op := range refused {
					x := newTensor(dt, shape, func(i int) int64 { return val(r, i) })
					err := pg.AllReduce(ctx, x, op).Wait(ctx)
					if !errors.Is(err, comm.ErrInvalidArgument) {
						return fmt.Errorf("all_reduce %v with %v: got %v, want ErrInvalidArgument", dt, op, err)
					}
				}
			}
		}
		return nil
	})
}

func (s *suite) testAllReduceCoalesced(t *testing.T) {
	for _, alg := range algorithms {
		for _, n := range []int{1, 3, 4} {
			t.Run(fmt.Sprintf("%s/n=%d", alg.name, n), func(t *testing.T) {
				ctx := testCtx(t)
				pgs := s.world(t, n, alg.opts...)
				sizes := []int{3, 0, 11, 1}
				mustEach(t, pgs, func(r int, pg *comm.ProcessGroup) error {
					for _, dt := range []tensor.Dtype{tensor.Float64, tensor.Int32} {
						ts := make([]*tensor.Dense, len(sizes))
						off := 0
						for j, sz := range sizes {
							o := off
							ts[j] = newTensor(dt, []int{sz}, func(i int) int64 { return val(r, o+i) })
							off += sz
						}
						if err := pg.AllReduceCoalesced(ctx, ts, comm.Sum).Wait(ctx); err != nil {
							return err
						}
						off = 0
						for j, sz := range sizes {
							want := expected(dt, comm.Sum, inputsOf(n, off, sz))
							if got := values(ts[j]); !equal(got, want) {
								return fmt.Errorf("%v tensor %d: got %v, want %v", dt, j, got, want)
							}
							off += sz
						}
					}
					mixed := []*tensor.Dense{newTensor(tensor.Float32, []int{2}, func(int) int64 { return 1 }), newTensor(tensor.Int64, []int{2}, func(int) int64 { return 1 })}
					if err := pg.AllReduceCoalesced(ctx, mixed, comm.Sum).Wait(ctx); !errors.Is(err, comm.ErrInvalidArgument) {
						return fmt.Errorf("mixed dtypes: got %v, want ErrInvalidArgument", err)
					}
					return nil
				})
			})
		}
	}
}

func (s *suite) testBroadcast(t *testing.T) {
	s.eachVariant(t, stagings, func(ctx context.Context, n, r int, pg *comm.ProcessGroup) error {
		for root := range n {
			for _, dt := range dtypes {
				for _, shape := range shapes {
					x := newTensor(dt, shape, func(i int) int64 { return val(r, i) })
					if err := pg.Broadcast(ctx, x, root).Wait(ctx); err != nil {
						return fmt.Errorf("broadcast %v %v root %d: %w", dt, shape, root, err)
					}
					want := castAll(dt, inputsOf(n, 0, numel(shape))[root])
					if got := values(x); !equal(got, want) {
						return fmt.Errorf("broadcast %v %v root %d: got %v, want %v", dt, shape, root, got, want)
					}
				}
			}
		}
		return nil
	})
}

// reduces run reduce through the transport and, on backends whose ranks
// share a host, through the staging segment whole and by blocks.
var reduces = append(stagings[:len(stagings):len(stagings)], variant{"staged-blocks", []comm.Option{comm.WithRingThreshold(0)}})

// variant is a named set of group options a collective's tests run under.
type variant = struct {
	name string
	opts []comm.Option
}

// eachVariant runs body on every rank of worlds of 1 to maxWorld ranks
// made with each variant's options, a subtest each.
func (s *suite) eachVariant(t *testing.T, variants []variant, body func(ctx context.Context, n, r int, pg *comm.ProcessGroup) error) {
	for _, v := range variants {
		for n := 1; n <= maxWorld; n++ {
			t.Run(fmt.Sprintf("%s/n=%d", v.name, n), func(t *testing.T) {
				ctx := testCtx(t)
				mustEach(t, s.world(t, n, v.opts...), func(r int, pg *comm.ProcessGroup) error { return body(ctx, n, r, pg) })
			})
		}
	}
}

func (s *suite) testReduce(t *testing.T) {
	s.eachVariant(t, reduces, func(ctx context.Context, n, r int, pg *comm.ProcessGroup) error {
		for root := range n {
			for _, dt := range dtypes {
				ok, _ := opsFor(dt)
				for _, shape := range [][]int{{0}, {1}, {7}, {2, 3}} {
					for _, op := range ok {
						x := newTensor(dt, shape, func(i int) int64 { return val(r, i) })
						if err := pg.Reduce(ctx, x, root, op).Wait(ctx); err != nil {
							return fmt.Errorf("reduce %v %v %v root %d: %w", dt, shape, op, root, err)
						}
						in := inputsOf(n, 0, numel(shape))
						want := castAll(dt, in[r])
						if r == root {
							want = expected(dt, op, in)
						}
						if got := values(x); !equal(got, want) {
							return fmt.Errorf("reduce %v %v %v root %d: got %v, want %v (rank %d)", dt, shape, op, root, got, want, r)
						}
					}
				}
			}
		}
		return nil
	})
}

func (s *suite) testAllGather(t *testing.T) {
	s.eachVariant(t, stagings, func(ctx context.Context, n, r int, pg *comm.ProcessGroup) error {
		for _, dt := range dtypes {
			for _, shape := range [][]int{{0}, {}, {5}, {2, 3}} {
				in := newTensor(dt, shape, func(i int) int64 { return val(r, i) })
				outs := make([]*tensor.Dense, n)
				for i := range outs {
					outs[i] = zeros(dt, shape)
				}
				if err := pg.AllGather(ctx, outs, in).Wait(ctx); err != nil {
					return fmt.Errorf("all_gather %v %v: %w", dt, shape, err)
				}
				all := inputsOf(n, 0, numel(shape))
				for i := range outs {
					if got, want := values(outs[i]), castAll(dt, all[i]); !equal(got, want) {
						return fmt.Errorf("all_gather %v %v: outs[%d] = %v, want %v", dt, shape, i, got, want)
					}
				}
				if len(shape) == 0 {
					continue
				}
				big := append([]int{n * shape[0]}, shape[1:]...)
				out := zeros(dt, big)
				if err := pg.AllGatherIntoTensor(ctx, out, in).Wait(ctx); err != nil {
					return fmt.Errorf("all_gather_into_tensor %v %v: %w", dt, shape, err)
				}
				var want []float64
				for i := range n {
					want = append(want, castAll(dt, all[i])...)
				}
				if got := values(out); !equal(got, want) {
					return fmt.Errorf("all_gather_into_tensor %v %v: got %v, want %v", dt, shape, got, want)
				}
			}
		}
		return nil
	})
}

func (s *suite) testGatherScatter(t *testing.T) {
	s.eachVariant(t, stagings, func(ctx context.Context, n, r int, pg *comm.ProcessGroup) error {
		for root := range n {
			for _, dt := range dtypes {
				for _, shape := range [][]int{{0}, {4}, {2, 3}} {
					in := newTensor(dt, shape, func(i int) int64 { return val(r, i) })
					var outs []*tensor.Dense
					if r == root {
						outs = make([]*tensor.Dense, n)
						for i := range outs {
							outs[i] = zeros(dt, shape)
						}
					}
					if err := pg.Gather(ctx, outs, in, root).Wait(ctx); err != nil {
						return fmt.Errorf("gather %v %v root %d: %w", dt, shape, root, err)
					}
					all := inputsOf(n, 0, numel(shape))
					for i := range outs {
						if got, want := values(outs[i]), castAll(dt, all[i]); !equal(got, want) {
							return fmt.Errorf("gather %v %v root %d: outs[%d] = %v, want %v", dt, shape, root, i, got, want)
						}
					}

					// Scatter: root sends block i (values of rank i) to rank i.
					var ins []*tensor.Dense
					if r == root {
						ins = make([]*tensor.Dense, n)
						for i := range ins {
							ins[i] = newTensor(dt, shape, func(e int) int64 { return val(i, e) })
						}
					}
					out := zeros(dt, shape)
					if err := pg.Scatter(ctx, out, ins, root).Wait(ctx); err != nil {
						return fmt.Errorf("scatter %v %v root %d: %w", dt, shape, root, err)
					}
					if got, want := values(out), castAll(dt, all[r]); !equal(got, want) {
						return fmt.Errorf("scatter %v %v root %d: got %v, want %v", dt, shape, root, got, want)
					}
				}
			}
		}
		return nil
	})
}

func (s *suite) testReduceScatter(t *testing.T) {
	s.eachVariant(t, stagings, func(ctx context.Context, n, r int, pg *comm.ProcessGroup) error {
		for _, dt := range dtypes {
			ok, _ := opsFor(dt)
			for _, k := range []int{0, 1, 5} {
				for _, op := range ok {
					// Block j of every rank (elements j*k .. j*k+k-1) reduces into rank j.
					ins := make([]*tensor.Dense, n)
					for j := range ins {
						ins[j] = newTensor(dt, []int{k}, func(i int) int64 { return val(r, j*k+i) })
					}
					out := zeros(dt, []int{k})
					if err := pg.ReduceScatter(ctx, out, ins, op).Wait(ctx); err != nil {
						return fmt.Errorf("reduce_scatter %v k=%d %v: %w", dt, k, op, err)
					}
					want := expected(dt, op, inputsOf(n, r*k, k))
					if got := values(out); !equal(got, want) {
						return fmt.Errorf("reduce_scatter %v k=%d %v: got %v, want %v", dt, k, op, got, want)
					}
					for j := range ins {
						if got, want := values(ins[j]), castAll(dt, inputsOf(n, j*k, k)[r]); !equal(got, want) {
							return fmt.Errorf("reduce_scatter changed its input %d: %v, was %v", j, got, want)
						}
					}

					in := newTensor(dt, []int{n * k}, func(i int) int64 { return val(r, i) })
					out2 := zeros(dt, []int{k})
					if err := pg.ReduceScatterTensor(ctx, out2, in, op).Wait(ctx); err != nil {
						return fmt.Errorf("reduce_scatter_tensor %v k=%d %v: %w", dt, k, op, err)
					}
					if got := values(out2); !equal(got, want) {
						return fmt.Errorf("reduce_scatter_tensor %v k=%d %v: got %v, want %v", dt, k, op, got, want)
					}
				}
			}
		}
		return nil
	})
}

func (s *suite) testAllToAll(t *testing.T) {
	for n := 1; n <= maxWorld; n++ {
		t.Run(fmt.Sprintf("n=%d", n), func(t *testing.T) {
			ctx := testCtx(t)
			pgs := s.world(t, n)
			// Rank i sends rank j a block of (i+j)%3 elements whose values
			// are val(i, 10*j+e); shapes differ from pair to pair.
			size := func(i, j int) int { return (i + j) % 3 }
			mustEach(t, pgs, func(r int, pg *comm.ProcessGroup) error {
				for _, dt := range dtypes {
					ins := make([]*tensor.Dense, n)
					outs := make([]*tensor.Dense, n)
					for j := range n {
						ins[j] = newTensor(dt, []int{size(r, j)}, func(e int) int64 { return val(r, 10*j+e) })
						outs[j] = zeros(dt, []int{size(j, r)})
					}
					if err := pg.AllToAll(ctx, outs, ins).Wait(ctx); err != nil {
						return fmt.Errorf("all_to_all %v: %w", dt, err)
					}
					for i := range n {
						want := castAll(dt, fill(size(i, r), func(e int) int64 { return val(i, 10*r+e) }))
						if got := values(outs[i]); !equal(got, want) {
							return fmt.Errorf("all_to_all %v: from rank %d got %v, want %v", dt, i, got, want)
						}
					}

					// AllToAllSingle with uneven splits of rows of width 2.
					split := func(i, j int) int { return (i+j)%3 + 1 }
					inSplits, outSplits := make([]int, n), make([]int, n)
					inRows, outRows := 0, 0
					for j := range n {
						inSplits[j], outSplits[j] = split(r, j), split(j, r)
						inRows += inSplits[j]
						outRows += outSplits[j]
					}
					// Row q of the input, in the block for rank j at row e: values val(r, 100*j+2*e+c).
					inVals := make([]int64, 0, 2*inRows)
					for j := range n {
						for e := range split(r, j) {
							inVals = append(inVals, val(r, 100*j+2*e), val(r, 100*j+2*e+1))
						}
					}
					in := newTensor(dt, []int{inRows, 2}, func(i int) int64 { return inVals[i] })
					out := zeros(dt, []int{outRows, 2})
					if err := pg.AllToAllSingle(ctx, out, in, outSplits, inSplits).Wait(ctx); err != nil {
						return fmt.Errorf("all_to_all_single %v: %w", dt, err)
					}
					var want []int64
					for i := range n {
						for e := range split(i, r) {
							want = append(want, val(i, 100*r+2*e), val(i, 100*r+2*e+1))
						}
					}
					if got := values(out); !equal(got, castAll(dt, want)) {
						return fmt.Errorf("all_to_all_single %v: got %v, want %v", dt, got, castAll(dt, want))
					}

					// Equal splits (nil): 2 rows per rank.
					in = newTensor(dt, []int{2 * n, 3}, func(i int) int64 { return val(r, i) })
					out = zeros(dt, []int{2 * n, 3})
					if err := pg.AllToAllSingle(ctx, out, in, nil, nil).Wait(ctx); err != nil {
						return fmt.Errorf("all_to_all_single equal %v: %w", dt, err)
					}
					want = want[:0]
					for i := range n {
						for e := range 6 {
							want = append(want, val(i, 6*r+e))
						}
					}
					if got := values(out); !equal(got, castAll(dt, want)) {
						return fmt.Errorf("all_to_all_single equal %v: got %v, want %v", dt, got, castAll(dt, want))
					}
				}
				return nil
			})
		})
	}
}

func (s *suite) testBarrier(t *testing.T) {
	for _, n := range []int{1, 2, 5} {
		t.Run(fmt.Sprintf("n=%d", n), func(t *testing.T) {
			ctx := testCtx(t)
			pgs := s.world(t, n)
			// Every rank publishes before the barrier and reads every other
			// rank's publication after it.
			arrived := make([]chan struct{}, n)
			for i := range arrived {
				arrived[i] = make(chan struct{})
			}
			mustEach(t, pgs, func(r int, pg *comm.ProcessGroup) error {
				close(arrived[r])
				if err := pg.Barrier(ctx).Wait(ctx); err != nil {
					return err
				}
				for i, ch := range arrived {
					select {
					case <-ch:
					default:
						return fmt.Errorf("passed the barrier before rank %d reached it", i)
					}
				}
				return nil
			})
		})
	}
}

func (s *suite) testManyInFlight(t *testing.T) {
	const ops = 40
	for _, alg := range algorithms {
		t.Run(alg.name, func(t *testing.T) {
			ctx := testCtx(t)
			n := 4
			pgs := s.world(t, n, alg.opts...)
			mustEach(t, pgs, func(r int, pg *comm.ProcessGroup) error {
				ts := make([]*tensor.Dense, ops)
				works := make([]comm.Work, 0, 2*ops)
				for k := range ops {
					ts[k] = newTensor(tensor.Float64, []int{k + 1}, func(i int) int64 { return val(r, k+i) })
					works = append(works, pg.AllReduce(ctx, ts[k], comm.Sum))
					// The same tensor, changed by a broadcast issued right after:
					// collectives of a group run in issue order.
					works = append(works, pg.Broadcast(ctx, ts[k], k%n))
				}
				for _, w := range works {
					if err := w.Wait(ctx); err != nil {
						return err
					}
				}
				for k := range ops {
					want := expected(tensor.Float64, comm.Sum, inputsOf(n, k, k+1))
					if got := values(ts[k]); !equal(got, want) {
						return fmt.Errorf("op %d: got %v, want %v", k, got, want)
					}
				}
				return nil
			})
		})
	}
}
