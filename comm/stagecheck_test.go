//go:build linux

package comm_test

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"gorgonia.org/tensor"

	"github.com/tandemml/tandem/comm"
	"github.com/tandemml/tandem/comm/commtest"
	"github.com/tandemml/tandem/comm/local"
	"github.com/tandemml/tandem/comm/shm"
)

// TestStageCheckedSendsNothing: once the staging segment is mapped, small
// all-reduces on which the ranks agree carry their fingerprints in the
// segment: not one byte goes through the transport, and the sums are
// right, for every reduce kind that has a one-buffer path.
func TestStageCheckedSendsNothing(t *testing.T) {
	const n, elems = 3, 1000
	var sent atomic.Int64
	pgs := commtest.Groups(t, commtest.Counting(local.Backend{}, &sent), n)
	ctx := shortCtx(t)
	allReduceFilled(t, ctx, pgs, tensor.Float32, elems, "mapping") // maps the segment
	before := sent.Load()
	for round := range 20 {
		for _, op := range []comm.ReduceOp{comm.Sum, comm.Avg, comm.Max} {
			xs := make([]*tensor.Dense, n)
			for r, err := range eachRank(pgs, func(r int, pg *comm.ProcessGroup) error {
				xs[r] = tensor.New(tensor.Of(tensor.Float64), tensor.WithShape(elems))
				fill(xs[r], r)
				return pg.AllReduce(ctx, xs[r], op).Wait(ctx)
			}) {
				if err != nil {
					t.Fatalf("round %d %v: rank %d: %v", round, op, r, err)
				}
			}
			for r, x := range xs {
				for i := range elems {
					if got, want := at(x, i), wantReduced(op, tensor.Float64, n, i); got != want {
						t.Fatalf("round %d %v: rank %d element %d = %v, want %v", round, op, r, i, got, want)
					}
				}
			}
		}
	}
	if moved := sent.Load() - before; moved != 0 {
		t.Errorf("60 small all-reduces sent %d bytes through the transport; want none", moved)
	}
}

// TestStageCheckedMismatch: with the staging segment mapped, a small
// all-reduce that one rank calls differently (another length, a
// collective through the staging segment or the transport, one with
// invalid arguments, a large all-reduce) fails on every rank with
// ErrMismatch naming both calls, and the group goes on: the next small and
// large all-reduces are right. Over the shm transport too, whose
// fingerprint messages a stale receive would take.
func TestStageCheckedMismatch(t *testing.T) {
	const n, small, big = 3, 10, 400000
	for _, backend := range []struct {
		name string
		pgs  func(t *testing.T) []*comm.ProcessGroup
	}{
		{"local", func(t *testing.T) []*comm.ProcessGroup { return commtest.Groups(t, local.Backend{}, n) }},
		{"shm", func(t *testing.T) []*comm.ProcessGroup { return commtest.Groups(t, shm.NewBackend(), n) }},
	} {
		t.Run(backend.name, func(t *testing.T) {
			pgs := backend.pgs(t)
			ctx := shortCtx(t)
			check := func(what string, elems int) { t.Helper(); checkSummed(t, ctx, pgs, elems, what) }
			check("mapping", big)
			vec := func(dt tensor.Dtype, k int) *tensor.Dense { return tensor.New(tensor.Of(dt), tensor.WithShape(k)) }
			for _, c := range []struct {
				name string
				odd  func(pg *comm.ProcessGroup) comm.Work // rank 1's call
				want string                                // how errors name it
			}{
				{"length", func(pg *comm.ProcessGroup) comm.Work {
					return pg.AllReduce(ctx, vec(tensor.Float64, small+1), comm.Sum)
				},
					"all_reduce(float64,[11],sum)"},
				{"dtype", func(pg *comm.ProcessGroup) comm.Work { return pg.AllReduce(ctx, vec(tensor.Float32, small), comm.Sum) },
					"all_reduce(float32,[10],sum)"},
				{"broadcast", func(pg *comm.ProcessGroup) comm.Work { return pg.Broadcast(ctx, vec(tensor.Float64, small), 0) },
					"broadcast(float64,[10],root=0)"},
				{"barrier", func(pg *comm.ProcessGroup) comm.Work { return pg.Barrier(ctx) }, "barrier()"},
				{"invalid", func(pg *comm.ProcessGroup) comm.Work { return pg.AllReduce(ctx, vec(tensor.Float64, small), comm.BAnd) },
					"band"},
				{"large", func(pg *comm.ProcessGroup) comm.Work { return pg.AllReduce(ctx, vec(tensor.Float64, big), comm.Sum) },
					"all_reduce(float64,[400000],sum)"},
			} {
				start := time.Now()
				for r, err := range eachRank(pgs, func(r int, pg *comm.ProcessGroup) error {
					if r == 1 {
						return c.odd(pg).Wait(ctx)
					}
					return pg.AllReduce(ctx, vec(tensor.Float64, small), comm.Sum).Wait(ctx)
				}) {
					if r == 1 && c.name == "invalid" {
						if !errors.Is(err, comm.ErrInvalidArgument) {
							t.Errorf("%s: rank 1 got %v, want ErrInvalidArgument", c.name, err)
						}
						continue
					}
					if !errors.Is(err, comm.ErrMismatch) {
						t.Errorf("%s: rank %d got %v, want ErrMismatch", c.name, r, err)
						continue
					}
					for _, w := range []string{"all_reduce(float64,[10],sum)", c.want} {
						if !strings.Contains(err.Error(), w) {
							t.Errorf("%s: rank %d's error does not name %q: %v", c.name, r, w, err)
						}
					}
				}
				if took := time.Since(start); took > 5*time.Second {
					t.Errorf("%s: the mismatch took %v to report", c.name, took)
				}
				check("after "+c.name+", small", small)
				check("after "+c.name+", large", big)
			}
		})
	}
}

// TestStageCheckedLatePeer: a rank that joins a small all-reduce long after
// the others (past the time after which they listen for fingerprints
// through the transport) is no mismatch: every rank succeeds, and the
// following collectives, small and through the transport, are right.
func TestStageCheckedLatePeer(t *testing.T) {
	const n, small, big = 2, 100, 400000
	pgs := commtest.Groups(t, shm.NewBackend(), n)
	ctx := shortCtx(t)
	allReduceFilled(t, ctx, pgs, tensor.Float64, big, "mapping")
	for round := range 3 {
		for r, err := range eachRank(pgs, func(r int, pg *comm.ProcessGroup) error {
			if r == round%n {
				time.Sleep(150 * time.Millisecond)
			}
			x := tensor.New(tensor.Of(tensor.Float64), tensor.WithShape(small))
			fill(x, r)
			if err := pg.AllReduce(ctx, x, comm.Sum).Wait(ctx); err != nil {
				return err
			}
			if got, want := at(x, small-1), wantReduced(comm.Sum, tensor.Float64, n, small-1); got != want {
				t.Errorf("round %d rank %d: last element %v, want %v", round, r, got, want)
			}
			return nil
		}) {
			if err != nil {
				t.Fatalf("round %d rank %d: %v", round, r, err)
			}
		}
		checkSummed(t, ctx, pgs, big, "after a late peer")
		for r, err := range eachRank(pgs, func(r int, pg *comm.ProcessGroup) error { return pg.Barrier(ctx).Wait(ctx) }) {
			if err != nil {
				t.Fatalf("round %d rank %d: barrier: %v", round, r, err)
			}
		}
	}
}

// TestStageCheckedMissingPeer: a rank that never joins a small all-reduce
// fails it on the others at their deadline with ErrTimeout, naming it.
func TestStageCheckedMissingPeer(t *testing.T) {
	const n, big = 2, 400000
	pgs := commtest.Groups(t, local.Backend{}, n)
	ctx := shortCtx(t)
	allReduceFilled(t, ctx, pgs, tensor.Float64, big, "mapping")
	short, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel()
	err := pgs[0].AllReduce(short, tensor.New(tensor.Of(tensor.Float64), tensor.WithShape(8)), comm.Sum).Wait(ctx)
	if !errors.Is(err, comm.ErrTimeout) || !strings.Contains(err.Error(), "[1]") {
		t.Fatalf("got %v, want ErrTimeout naming rank 1", err)
	}
}

// BenchmarkStageCheckedAllReduce times a small all-reduce (4 KiB) of two
// goroutine ranks over the shm backend, its fingerprint checked in the
// staging segment, and counts what it allocates.
func BenchmarkStageCheckedAllReduce(b *testing.B) {
	const n, elems = 2, 1024
	pgs := commtest.Groups(b, shm.NewBackend(), n)
	ctx := context.Background()
	xs := make([]*tensor.Dense, n)
	for r := range n {
		xs[r] = tensor.New(tensor.Of(tensor.Float32), tensor.WithShape(elems))
	}
	b.SetBytes(4 * elems)
	b.ReportAllocs()
	for b.Loop() {
		for r, err := range eachRank(pgs, func(r int, pg *comm.ProcessGroup) error {
			return pg.AllReduce(ctx, xs[r], comm.Sum).Wait(ctx)
		}) {
			if err != nil {
				b.Fatalf("rank %d: %v", r, err)
			}
		}
	}
}
