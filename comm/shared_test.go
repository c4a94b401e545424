//go:build linux

package comm_test

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"gorgonia.org/tensor"

	"github.com/tandemml/tandem/comm"
	"github.com/tandemml/tandem/comm/commtest"
	"github.com/tandemml/tandem/comm/local"
	"github.com/tandemml/tandem/comm/shm"
	"github.com/tandemml/tandem/comm/transport"
	"github.com/tandemml/tandem/internal/testkit"
)

// hiddenHost connects inner's transports and hides whether they run on
// one host.
type hiddenHost struct{ inner transport.Backend }

func (b hiddenHost) Connect(ctx context.Context, cfg transport.Config) (transport.Transport, error) {
	tr, err := b.inner.Connect(ctx, cfg)
	if err != nil {
		return nil, err
	}
	return plainTransport{tr}, nil
}

// plainTransport hides whether its transport runs on one host.
type plainTransport struct{ transport.Transport }

// eachRank runs f on every rank at once and returns their errors.
func eachRank(pgs []*comm.ProcessGroup, f func(r int, pg *comm.ProcessGroup) error) []error {
	return testkit.EachRank(len(pgs), func(r int) error { return f(r, pgs[r]) })
}

func shortCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func newShared(t *testing.T, ctx context.Context, pgs []*comm.ProcessGroup, dt tensor.Dtype, n int) []*comm.SharedTensor {
	t.Helper()
	sts := make([]*comm.SharedTensor, len(pgs))
	for r, err := range eachRank(pgs, func(r int, pg *comm.ProcessGroup) error {
		var err error
		sts[r], err = pg.NewSharedTensor(ctx, dt, n)
		return err
	}) {
		if err != nil {
			t.Fatalf("rank %d: NewSharedTensor: %v", r, err)
		}
	}
	t.Cleanup(func() {
		for _, st := range sts {
			st.Close()
		}
	})
	return sts
}

// fill writes rank r's values, (r+1)·(i%7+1) at element i, into t.
func fill(t *tensor.Dense, r int) {
	switch d := t.Data().(type) {
	case []float32:
		for i := range d {
			d[i] = float32((r + 1) * (i%7 + 1))
		}
	case []float64:
		for i := range d {
			d[i] = float64((r + 1) * (i%7 + 1))
		}
	case []int64:
		for i := range d {
			d[i] = int64((r + 1) * (i%7 + 1))
		}
	}
}

func at(t *tensor.Dense, i int) float64 {
	switch d := t.Data().(type) {
	case []float32:
		return float64(d[i])
	case []float64:
		return d[i]
	case []int64:
		return float64(d[i])
	}
	panic(fmt.Sprintf("dtype %v", t.Dtype()))
}

// TestSharedTensorAllReduce: all-reduces of shared tensors give the
// reduction on every rank, for several worlds, dtypes and ops and for a
// part of the tensor, and send no more than barrier and fingerprint bytes
// through the transport: the data never goes through it.
func TestSharedTensorAllReduce(t *testing.T) {
	for _, c := range []struct {
		name   string
		inner  transport.Backend
		worlds []int
	}{{"shm", shm.NewBackend(shm.WithRingBytes(256 << 10)), []int{2, 3, 4}}, {"local", local.Backend{}, []int{3}}} {
		name, inner := c.name, c.inner
		for _, n := range c.worlds {
			t.Run(fmt.Sprintf("%s/world%d", name, n), func(t *testing.T) {
				var sent atomic.Int64
				pgs := commtest.Groups(t, commtest.Counting(inner, &sent), n)
				ctx := shortCtx(t)
				const elems = 40000 // 160 KiB of float32: above the ring threshold
				for _, dt := range []tensor.Dtype{tensor.Float32, tensor.Float64, tensor.Int64} {
					sts := newShared(t, ctx, pgs, dt, elems)
					ops := []comm.ReduceOp{comm.Sum, comm.Max, comm.Avg}
					if dt != tensor.Int64 {
						ops = append(ops, comm.PremulSum(0.5))
					}
					for _, op := range ops {
						for r, st := range sts {
							fill(st.Tensor(), r)
						}
						before := sent.Load()
						for r, err := range eachRank(pgs, func(r int, pg *comm.ProcessGroup) error {
							return pg.AllReduce(ctx, sts[r].Tensor(), op).Wait(ctx)
						}) {
							if err != nil {
								t.Fatalf("%v %v rank %d: %v", dt, op, r, err)
							}
						}
						if moved := sent.Load() - before; moved > int64(n*n*1024) {
							t.Errorf("%v %v: the ranks sent %d bytes through the transport for a shared all-reduce of %d elements", dt, op, moved, elems)
						}
						for r, st := range sts {
							for _, i := range []int{0, 1, 6, elems / 2, elems - 1} {
								sum, mx := 0.0, 0.0
								for q := 0; q < n; q++ {
									v := float64((q + 1) * (i%7 + 1))
									sum += v
									mx = max(mx, v)
								}
								want := sum
								switch op {
								case comm.Max:
									want = mx
								case comm.Avg:
									want = sum / float64(n)
									if dt == tensor.Int64 {
										want = float64(int64(sum) / int64(n))
									}
								}
								if op != comm.Sum && op != comm.Max && op != comm.Avg {
									want = 0.5 * sum
								}
								if got := at(st.Tensor(), i); got != want {
									t.Fatalf("%v %v rank %d element %d = %v, want %v", dt, op, r, i, got, want)
								}
							}
						}
					}
				}
				// A contiguous part, at the same place on every rank.
				sts := newShared(t, ctx, pgs, tensor.Float32, 3*elems)
				for r, st := range sts {
					fill(st.Tensor(), r)
				}
				before := sent.Load()
				for r, err := range eachRank(pgs, func(r int, pg *comm.ProcessGroup) error {
					part := tensor.New(tensor.WithShape(elems), tensor.WithBacking(sts[r].Tensor().Float32s()[elems:2*elems]))
					return pg.AllReduce(ctx, part, comm.Sum).Wait(ctx)
				}) {
					if err != nil {
						t.Fatalf("part, rank %d: %v", r, err)
					}
				}
				if moved := sent.Load() - before; moved > int64(n*n*1024) {
					t.Errorf("part: the ranks sent %d bytes through the transport", moved)
				}
				for r, st := range sts {
					d := st.Tensor().Float32s()
					if d[elems-1] != float32((r+1)*((elems-1)%7+1)) || d[2*elems] != float32((r+1)*((2*elems)%7+1)) {
						t.Fatalf("rank %d: the all-reduce of a part changed the elements around it", r)
					}
					if want := float32(n*(n+1)/2) * float32(elems%7+1); d[elems] != want {
						t.Fatalf("rank %d: the part's first element = %v, want %v", r, d[elems], want)
					}
				}
			})
		}
	}
}

// TestSharedTensorClose: a closed shared tensor keeps its values and stays
// writable, and its all-reduce goes through the transport, correctly.
func TestSharedTensorClose(t *testing.T) {
	var sent atomic.Int64
	// Without staging, an ordinary tensor's all-reduce goes through the
	// transport, which counts it.
	pgs := commtest.Groups(t, commtest.Counting(shm.NewBackend(shm.WithRingBytes(256<<10)), &sent), 2, comm.WithStaging(false))
	ctx := shortCtx(t)
	const elems = 40000
	sts := newShared(t, ctx, pgs, tensor.Float32, elems)
	for r, st := range sts {
		fill(st.Tensor(), r)
		if err := st.Close(); err != nil {
			t.Fatalf("rank %d: Close: %v", r, err)
		}
		if err := st.Close(); err != nil {
			t.Fatalf("rank %d: second Close: %v", r, err)
		}
		if got := st.Tensor().Float32s()[elems-1]; got != float32((r+1)*((elems-1)%7+1)) {
			t.Fatalf("rank %d: after Close the last element is %v", r, got)
		}
	}
	before := sent.Load()
	for r, err := range eachRank(pgs, func(r int, pg *comm.ProcessGroup) error {
		return pg.AllReduce(ctx, sts[r].Tensor(), comm.Sum).Wait(ctx)
	}) {
		if err != nil {
			t.Fatalf("rank %d: %v", r, err)
		}
	}
	if moved := sent.Load() - before; moved < 4*elems {
		t.Errorf("closed shared tensors: the ranks sent only %d bytes; the all-reduce did not go through the transport", moved)
	}
	for r, st := range sts {
		if got := st.Tensor().Float32s()[3]; got != 3*4 {
			t.Fatalf("rank %d: element 3 = %v, want 12", r, got)
		}
	}
}

// TestSharedTensorMismatch: a rank that all-reduces a shared tensor while
// another passes an ordinary one gets an error, not a hang.
func TestSharedTensorMismatch(t *testing.T) {
	pgs := commtest.Groups(t, shm.NewBackend(shm.WithRingBytes(256<<10)), 2)
	ctx := shortCtx(t)
	const elems = 40000
	sts := newShared(t, ctx, pgs, tensor.Float32, elems)
	other := tensor.New(tensor.Of(tensor.Float32), tensor.WithShape(elems))
	errs := eachRank(pgs, func(r int, pg *comm.ProcessGroup) error {
		x := sts[r].Tensor()
		if r == 1 {
			x = other
		}
		return pg.AllReduce(ctx, x, comm.Sum).Wait(ctx)
	})
	for r, err := range errs {
		if !errors.Is(err, comm.ErrMismatch) {
			t.Errorf("rank %d: err = %v, want one wrapping ErrMismatch", r, err)
		}
	}
}

// TestSharedTensorRefused: a transport that does not run every rank on one
// host cannot make shared tensors (errors.ErrUnsupported), and bad dtypes
// and shapes are invalid arguments.
func TestSharedTensorRefused(t *testing.T) {
	ctx := shortCtx(t)
	pgs := commtest.Groups(t, hiddenHost{local.Backend{}}, 2)
	for r, err := range eachRank(pgs, func(r int, pg *comm.ProcessGroup) error {
		_, err := pg.NewSharedTensor(ctx, tensor.Float32, 10)
		return err
	}) {
		if !errors.Is(err, errors.ErrUnsupported) {
			t.Errorf("rank %d: err = %v, want one wrapping errors.ErrUnsupported", r, err)
		}
	}
	pgs = commtest.Groups(t, local.Backend{}, 2)
	for _, c := range []struct {
		dt    tensor.Dtype
		shape []int
	}{{comm.Float16Dtype, []int{4}}, {tensor.Float32, []int{0, 3}}, {tensor.Float32, []int{-1}}} {
		for r, err := range eachRank(pgs, func(r int, pg *comm.ProcessGroup) error {
			_, err := pg.NewSharedTensor(ctx, c.dt, c.shape...)
			return err
		}) {
			if !errors.Is(err, comm.ErrInvalidArgument) {
				t.Errorf("%v %v rank %d: err = %v, want one wrapping ErrInvalidArgument", c.dt, c.shape, r, err)
			}
		}
	}
}
