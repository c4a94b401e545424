package local_test

import (
	"context"
	"fmt"
	"sync"

	"gorgonia.org/tensor"

	"github.com/tandemml/tandem/comm"
	"github.com/tandemml/tandem/comm/local"
)

// Four ranks as goroutines of one process: each contributes its rank and
// every rank ends with the sum.
func ExampleNewGroups() {
	ctx := context.Background()
	groups, err := local.NewGroups(ctx, 4)
	if err != nil {
		panic(err)
	}
	sums := make([]float64, len(groups))
	var wg sync.WaitGroup
	for r, pg := range groups {
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer pg.Close()
			x := tensor.New(tensor.WithShape(1), tensor.WithBacking([]float64{float64(pg.Rank())}))
			if err := pg.AllReduce(ctx, x, comm.Sum).Wait(ctx); err != nil {
				panic(err)
			}
			sums[r] = x.Data().([]float64)[0]
		}()
	}
	wg.Wait()
	fmt.Println(sums)
	// Output: [6 6 6 6]
}
