package local_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"gorgonia.org/tensor"

	"github.com/tandemml/tandem/comm"
	"github.com/tandemml/tandem/comm/local"
)

// TestMismatchThenClose: a rank that finds a collective mismatched may return
// and close its group at once; every other rank must still report the
// mismatch, not a lost peer. Repeated, since it depends on who gets there
// first.
func TestMismatchThenClose(t *testing.T) {
	for _, world := range []int{2, 3} {
		for rep := 0; rep < 30; rep++ {
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			groups, err := local.NewGroups(ctx, world)
			if err != nil {
				t.Fatal(err)
			}
			errs := make([]error, world)
			var wg sync.WaitGroup
			for r, pg := range groups {
				wg.Add(1)
				go func() {
					defer wg.Done()
					n := 4
					if r == 0 {
						n = 5
					}
					x := tensor.New(tensor.Of(tensor.Float64), tensor.WithShape(n))
					errs[r] = pg.AllReduce(ctx, x, comm.Sum).Wait(ctx)
					pg.Close()
				}()
			}
			wg.Wait()
			cancel()
			for r, err := range errs {
				if !errors.Is(err, comm.ErrMismatch) {
					t.Fatalf("world %d, try %d: rank %d: %v, want an error wrapping ErrMismatch", world, rep, r, err)
				}
			}
		}
	}
}
