package comm_test

import (
	"context"
	"fmt"
	"sync"

	"github.com/tandemml/tandem/comm"
	"github.com/tandemml/tandem/comm/local"
	"gorgonia.org/tensor"
)

// Four ranks (goroutines here; processes with comm.InitFromEnv) sum their
// gradients with an all-reduce, then rank 0 shares a config with the others.
func Example() {
	ctx := context.Background()
	pgs, err := local.NewGroups(ctx, 4)
	if err != nil {
		panic(err)
	}
	results := make([]string, len(pgs))
	var wg sync.WaitGroup
	for r, pg := range pgs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer pg.Close()
			grad := tensor.New(tensor.WithShape(3), tensor.WithBacking([]float32{float32(r), 1, 2}))
			if err := pg.AllReduce(ctx, grad, comm.Avg).Wait(ctx); err != nil {
				results[r] = err.Error()
				return
			}
			cfg := map[string]int{}
			if pg.Rank() == 0 {
				cfg["batch"] = 32
			}
			if err := comm.BroadcastObject(ctx, pg, &cfg, 0); err != nil {
				results[r] = err.Error()
				return
			}
			results[r] = fmt.Sprintf("rank %d: grad %v, batch %d", pg.Rank(), grad.Data(), cfg["batch"])
		}()
	}
	wg.Wait()
	for _, line := range results {
		fmt.Println(line)
	}
	// Output:
	// rank 0: grad [1.5 1 2], batch 32
	// rank 1: grad [1.5 1 2], batch 32
	// rank 2: grad [1.5 1 2], batch 32
	// rank 3: grad [1.5 1 2], batch 32
}

// A collective that ranks call differently fails on every rank, naming both
// calls, instead of hanging.
func Example_mismatch() {
	ctx := context.Background()
	pgs, _ := local.NewGroups(ctx, 2)
	errs := make([]error, 2)
	var wg sync.WaitGroup
	for r, pg := range pgs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			x := tensor.New(tensor.WithShape(4), tensor.WithBacking(make([]float32, 4)))
			if r == 0 {
				errs[r] = pg.AllReduce(ctx, x, comm.Sum).Wait(ctx)
			} else {
				errs[r] = pg.Broadcast(ctx, x, 0).Wait(ctx)
			}
		}()
	}
	wg.Wait()
	fmt.Println(errs[1])
	// Output:
	// comm: collective #0 on group "world": rank 0 called all_reduce(float32,[4],sum) but rank 1 called broadcast(float32,[4],root=0) (ranks differing from rank 0: 1; this is rank 1): tandem: mismatch between ranks
}
