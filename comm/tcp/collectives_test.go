package tcp_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/tandemml/tandem/comm"
	"github.com/tandemml/tandem/comm/commtest"
	"github.com/tandemml/tandem/comm/tcp"
	"gorgonia.org/tensor"
)

// Collectives whose chunks are large enough to travel as single copies
// (the conformance suite's tensors are all small) give exact results, on
// both data paths.
func TestLargeCollectives(t *testing.T) {
	for _, single := range []bool{true, false} {
		for _, n := range []int{2, 3} {
			t.Run(fmt.Sprintf("single-copy=%v/n=%d", single, n), func(t *testing.T) {
				pgs := commtest.Groups(t, tcp.NewBackend(tcp.WithHost("127.0.0.1"), tcp.WithSameHostCopy(single)), n)
				ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
				defer cancel()
				const elems = 3<<20/4 + 5 // segments of about 1 MiB, not a multiple of the world size
				var wg sync.WaitGroup
				errs := make([]error, n)
				for r, pg := range pgs {
					wg.Add(1)
					go func() {
						defer wg.Done()
						errs[r] = largeRank(ctx, pg, r, n, elems)
					}()
				}
				wg.Wait()
				for r, err := range errs {
					if err != nil {
						t.Errorf("rank %d: %v", r, err)
					}
				}
			})
		}
	}
}

// largeRank all-reduces (sum and average) and broadcasts large tensors of
// small integers, whose float sums are exact, and checks every element.
func largeRank(ctx context.Context, pg *comm.ProcessGroup, r, n, elems int) error {
	x := make([]float32, elems)
	for i := range x {
		x[i] = float32((i%97)*(r+1) + r)
	}
	xt := tensor.New(tensor.WithShape(elems), tensor.WithBacking(x))
	if err := pg.AllReduce(ctx, xt, comm.Sum).Wait(ctx); err != nil {
		return err
	}
	tri := n * (n + 1) / 2
	for i, v := range x {
		if want := float32((i%97)*tri + tri - n); v != want {
			return fmt.Errorf("sum: element %d is %v, want %v", i, v, want)
		}
	}
	y := make([]float64, elems/2)
	for i := range y {
		y[i] = float64(n * (i%13 + r))
	}
	yt := tensor.New(tensor.WithShape(len(y)), tensor.WithBacking(y))
	if err := pg.AllReduce(ctx, yt, comm.Avg).Wait(ctx); err != nil {
		return err
	}
	for i, v := range y {
		if want := float64(n*(i%13) + tri - n); v != want {
			return fmt.Errorf("avg: element %d is %v, want %v", i, v, want)
		}
	}
	z := make([]int64, elems/4)
	if r == n-1 {
		for i := range z {
			z[i] = int64(i * 7)
		}
	}
	zt := tensor.New(tensor.WithShape(len(z)), tensor.WithBacking(z))
	if err := pg.Broadcast(ctx, zt, n-1).Wait(ctx); err != nil {
		return err
	}
	for i, v := range z {
		if v != int64(i*7) {
			return fmt.Errorf("broadcast: element %d is %v, want %v", i, v, i*7)
		}
	}
	return nil
}
