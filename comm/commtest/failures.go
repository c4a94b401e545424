package commtest

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/tandemml/tandem/comm"
	"github.com/tandemml/tandem/internal/testkit"
	"gorgonia.org/tensor"
)

func (s *suite) testInvalidArguments(t *testing.T) {
	ctx := testCtx(t)
	pgs := s.world(t, 2)
	f32 := func() *tensor.Dense { return newTensor(tensor.Float32, []int{4}, func(int) int64 { return 1 }) }
	i32 := func() *tensor.Dense { return newTensor(tensor.Int32, []int{4}, func(int) int64 { return 1 }) }
	cases := []struct {
		name string
		run  func(pg *comm.ProcessGroup) comm.Work
	}{
		{"nil tensor", func(pg *comm.ProcessGroup) comm.Work { return pg.AllReduce(ctx, nil, comm.Sum) }},
		{"unsupported dtype", func(pg *comm.ProcessGroup) comm.Work {
			return pg.AllReduce(ctx, tensor.New(tensor.WithShape(2), tensor.WithBacking([]bool{true, false})), comm.Sum)
		}},
		{"zero reduce op", func(pg *comm.ProcessGroup) comm.Work { return pg.AllReduce(ctx, f32(), comm.ReduceOp{}) }},
		{"bitwise on float", func(pg *comm.ProcessGroup) comm.Work { return pg.Reduce(ctx, f32(), 0, comm.BXor) }},
		{"fractional premul on int", func(pg *comm.ProcessGroup) comm.Work { return pg.AllReduce(ctx, i32(), comm.PremulSum(0.5)) }},
		{"root out of range", func(pg *comm.ProcessGroup) comm.Work { return pg.Broadcast(ctx, f32(), 2) }},
		{"outs of wrong length", func(pg *comm.ProcessGroup) comm.Work {
			return pg.AllGather(ctx, []*tensor.Dense{f32()}, f32())
		}},
		{"outs of wrong shape", func(pg *comm.ProcessGroup) comm.Work {
			return pg.AllGather(ctx, []*tensor.Dense{f32(), newTensor(tensor.Float32, []int{5}, func(int) int64 { return 0 })}, f32())
		}},
		{"output of wrong size", func(pg *comm.ProcessGroup) comm.Work { return pg.AllGatherIntoTensor(ctx, f32(), f32()) }},
		{"splits not summing", func(pg *comm.ProcessGroup) comm.Work {
			return pg.AllToAllSingle(ctx, f32(), f32(), []int{1, 1}, []int{3, 3})
		}},
	}
	for _, c := range cases {
		for r, err := range each(pgs, func(r int, pg *comm.ProcessGroup) error { return c.run(pg).Wait(ctx) }) {
			if !errors.Is(err, comm.ErrInvalidArgument) {
				t.Errorf("%s: rank %d got %v, want ErrInvalidArgument", c.name, r, err)
			}
		}
	}
	// One rank's invalid arguments fail the collective on the other rank too,
	// naming the problem, instead of leaving it waiting.
	errs := each(pgs, func(r int, pg *comm.ProcessGroup) error {
		if r == 1 {
			return pg.AllReduce(ctx, f32(), comm.BAnd).Wait(ctx)
		}
		return pg.AllReduce(ctx, f32(), comm.Sum).Wait(ctx)
	})
	if !errors.Is(errs[1], comm.ErrInvalidArgument) {
		t.Errorf("rank 1 (invalid op): got %v, want ErrInvalidArgument", errs[1])
	}
	if !errors.Is(errs[0], comm.ErrMismatch) || !strings.Contains(errs[0].Error(), "band") {
		t.Errorf("rank 0 (valid op): got %v, want ErrMismatch naming rank 1's band", errs[0])
	}
	// The group still works.
	mustEach(t, pgs, func(r int, pg *comm.ProcessGroup) error { return pg.AllReduce(ctx, f32(), comm.Sum).Wait(ctx) })
}

func (s *suite) testMismatch(t *testing.T) {
	for _, alg := range algorithms {
		t.Run(alg.name, func(t *testing.T) {
			ctx := testCtx(t)
			n := 3
			pgs := s.world(t, n, alg.opts...)
			vec := func(dt tensor.Dtype, k int) *tensor.Dense {
				return newTensor(dt, []int{k}, func(i int) int64 { return int64(i) })
			}
			cases := []struct {
				name string
				odd  func(pg *comm.ProcessGroup) comm.Work // rank 2's call
				want []string                              // both sides, as errors name them
			}{
				{"op", func(pg *comm.ProcessGroup) comm.Work { return pg.Broadcast(ctx, vec(tensor.Float32, 4), 0) },
					[]string{"all_reduce(float32,[4],sum)", "broadcast(float32,[4],root=0)"}},
				{"shape", func(pg *comm.ProcessGroup) comm.Work { return pg.AllReduce(ctx, vec(tensor.Float32, 5), comm.Sum) },
					[]string{"all_reduce(float32,[4],sum)", "all_reduce(float32,[5],sum)"}},
				{"dtype", func(pg *comm.ProcessGroup) comm.Work { return pg.AllReduce(ctx, vec(tensor.Float64, 4), comm.Sum) },
					[]string{"all_reduce(float32,[4],sum)", "all_reduce(float64,[4],sum)"}},
				{"reduce op", func(pg *comm.ProcessGroup) comm.Work { return pg.AllReduce(ctx, vec(tensor.Float32, 4), comm.Max) },
					[]string{"all_reduce(float32,[4],sum)", "all_reduce(float32,[4],max)"}},
				{"barrier", func(pg *comm.ProcessGroup) comm.Work { return pg.Barrier(ctx) },
					[]string{"all_reduce(float32,[4],sum)", "barrier()"}},
			}
			for _, c := range cases {
				errs := each(pgs, func(r int, pg *comm.ProcessGroup) error {
					if r == 2 {
						return c.odd(pg).Wait(ctx)
					}
					return pg.AllReduce(ctx, vec(tensor.Float32, 4), comm.Sum).Wait(ctx)
				})
				for r, err := range errs {
					if !errors.Is(err, comm.ErrMismatch) {
						t.Errorf("%s: rank %d got %v, want ErrMismatch", c.name, r, err)
						continue
					}
					for _, w := range c.want {
						if !strings.Contains(err.Error(), w) {
							t.Errorf("%s: rank %d's error does not name %q: %v", c.name, r, w, err)
						}
					}
				}
				// A mismatch does not break the group.
				mustEach(t, pgs, func(r int, pg *comm.ProcessGroup) error {
					x := vec(tensor.Int64, 3)
					if err := pg.AllReduce(ctx, x, comm.Sum).Wait(ctx); err != nil {
						return fmt.Errorf("after %s mismatch: %w", c.name, err)
					}
					if got := values(x); !equal(got, []float64{0, 3, 6}) {
						return fmt.Errorf("after %s mismatch: got %v", c.name, got)
					}
					return nil
				})
			}
		})
	}
}

func (s *suite) testDeadline(t *testing.T) {
	t.Run("context", func(t *testing.T) {
		ctx := testCtx(t)
		pgs := s.world(t, 3)
		first := make(chan error, 1)
		errs := each(pgs, func(r int, pg *comm.ProcessGroup) error {
			x := newTensor(tensor.Float32, []int{8}, func(int) int64 { return 1 })
			switch r {
			case 0:
				short, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
				defer cancel()
				err := pg.AllReduce(short, x, comm.Sum).Wait(ctx)
				first <- err
				return err
			case 1:
				// Joins the collective and is stuck with rank 0 until rank 0
				// gives up and aborts. Rank 2's data, sent once rank 0 gave
				// up, may race rank 0's abort here and complete this
				// collective with what rank 0 sent before; the one after it
				// then fails.
				err := pg.AllReduce(ctx, x, comm.Sum).Wait(ctx)
				if err == nil {
					err = pg.AllReduce(ctx, x, comm.Sum).Wait(ctx)
				}
				return err
			default:
				// Never joins; its next collective finds the group aborted.
				// Rank 0's abort travels behind any data it sent before giving
				// up, so where that data completes the collective here (a small
				// tensor is exchanged whole), the collective after it fails.
				<-first
				err := pg.AllReduce(ctx, x, comm.Sum).Wait(ctx)
				if err == nil {
					err = pg.AllReduce(ctx, x, comm.Sum).Wait(ctx)
				}
				return err
			}
		})
		if !errors.Is(errs[0], comm.ErrTimeout) || !errors.Is(errs[0], context.DeadlineExceeded) {
			t.Errorf("rank 0: got %v, want ErrTimeout wrapping context.DeadlineExceeded", errs[0])
		} else if !strings.Contains(errs[0].Error(), "rank 2") {
			t.Errorf("rank 0's error does not name the missing rank 2: %v", errs[0])
		}
		for r := 1; r < 3; r++ {
			if !errors.Is(errs[r], comm.ErrPeerLost) {
				t.Errorf("rank %d: got %v, want ErrPeerLost", r, errs[r])
			}
		}
	})
	t.Run("default timeout", func(t *testing.T) {
		ctx := testCtx(t)
		pgs := s.world(t, 2, comm.WithTimeout(200*time.Millisecond))
		x := newTensor(tensor.Int32, []int{2}, func(int) int64 { return 1 })
		err := pgs[0].Broadcast(context.Background(), x, 1).Wait(ctx)
		if !errors.Is(err, comm.ErrTimeout) {
			t.Errorf("got %v, want ErrTimeout after the group's default timeout", err)
		}
	})
	t.Run("wait", func(t *testing.T) {
		ctx := testCtx(t)
		pgs := s.world(t, 2)
		x := newTensor(tensor.Int32, []int{2}, func(int) int64 { return 1 })
		w := pgs[0].AllReduce(ctx, x, comm.Sum)
		short, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
		defer cancel()
		if err := w.Wait(short); !errors.Is(err, comm.ErrTimeout) {
			t.Errorf("Wait with an expired context: got %v, want ErrTimeout", err)
		}
		if w.Err() != nil {
			t.Errorf("Err before Done: %v", w.Err())
		}
		// The operation itself is still alive: the peer completes it.
		y := newTensor(tensor.Int32, []int{2}, func(int) int64 { return 2 })
		if err := pgs[1].AllReduce(ctx, y, comm.Sum).Wait(ctx); err != nil {
			t.Fatal(err)
		}
		if err := w.Wait(ctx); err != nil {
			t.Fatal(err)
		}
		<-w.Done()
		if got := values(x); !equal(got, []float64{3, 3}) {
			t.Errorf("got %v, want [3 3]", got)
		}
	})
}

func (s *suite) testAbort(t *testing.T) {
	ctx := testCtx(t)
	pgs := s.world(t, 3)
	boom := errors.New("boom")
	errs := each(pgs, func(r int, pg *comm.ProcessGroup) error {
		x := newTensor(tensor.Float64, []int{1000}, func(int) int64 { return 1 })
		if r == 0 {
			time.Sleep(50 * time.Millisecond)
			pg.Abort(boom)
			return pg.AllReduce(ctx, x, comm.Sum).Wait(ctx)
		}
		return pg.AllReduce(ctx, x, comm.Sum).Wait(ctx)
	})
	if !errors.Is(errs[0], boom) {
		t.Errorf("rank 0 (aborted): got %v, want an error wrapping the abort cause", errs[0])
	}
	for r := 1; r < 3; r++ {
		if !errors.Is(errs[r], comm.ErrPeerLost) {
			t.Errorf("rank %d: got %v, want ErrPeerLost", r, errs[r])
		}
	}
}

func (s *suite) testClosed(t *testing.T) {
	ctx := testCtx(t)
	before := runtime.NumGoroutine()
	pgs := s.newGroups(t, 3)
	mustEach(t, pgs, func(r int, pg *comm.ProcessGroup) error {
		for range 5 {
			x := newTensor(tensor.Float32, []int{100}, func(int) int64 { return 1 })
			if err := pg.AllReduce(ctx, x, comm.Sum).Wait(ctx); err != nil {
				return err
			}
		}
		sub, err := pg.NewGroup(ctx, []int{0, 1})
		if err != nil {
			return err
		}
		if sub.IsMember() {
			if err := sub.Barrier(ctx).Wait(ctx); err != nil {
				return err
			}
		}
		return pg.Barrier(ctx).Wait(ctx)
	})
	closeAll(t, pgs)
	for r, pg := range pgs {
		x := newTensor(tensor.Float32, []int{1}, func(int) int64 { return 1 })
		if err := pg.AllReduce(ctx, x, comm.Sum).Wait(ctx); !errors.Is(err, comm.ErrClosed) {
			t.Errorf("rank %d: collective after Close: got %v, want ErrClosed", r, err)
		}
		if err := pg.Send(ctx, x, (r+1)%3, 0); !errors.Is(err, comm.ErrClosed) {
			t.Errorf("rank %d: send after Close: got %v, want ErrClosed", r, err)
		}
		if err := pg.Close(); err != nil {
			t.Errorf("rank %d: second Close: %v", r, err)
		}
	}
	testkit.RequireNoLeak(t, before)
}

func (s *suite) testMonitoredBarrier(t *testing.T) {
	t.Run("all arrive", func(t *testing.T) {
		ctx := testCtx(t)
		pgs := s.world(t, 3)
		mustEach(t, pgs, func(r int, pg *comm.ProcessGroup) error {
			return pg.MonitoredBarrier(ctx, 5*time.Second, true)
		})
	})
	for _, waitAll := range []bool{true, false} {
		t.Run(fmt.Sprintf("missing/waitAll=%v", waitAll), func(t *testing.T) {
			ctx := testCtx(t)
			pgs := s.world(t, 4)
			errs := each(pgs[:2], func(r int, pg *comm.ProcessGroup) error {
				return pg.MonitoredBarrier(ctx, 300*time.Millisecond, waitAll)
			})
			for r, err := range errs {
				if !errors.Is(err, comm.ErrTimeout) {
					t.Errorf("rank %d: got %v, want ErrTimeout", r, err)
					continue
				}
				want := "ranks 2"
				if waitAll {
					want = "ranks 2,3"
				}
				if !strings.Contains(err.Error(), want) {
					t.Errorf("rank %d: error does not name %q: %v", r, want, err)
				}
			}
		})
	}
}
