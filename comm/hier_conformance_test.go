package comm_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/tandemml/tandem/comm"
	"github.com/tandemml/tandem/comm/commtest"
	"github.com/tandemml/tandem/comm/store"
)

// TestHostsConformance runs the backend conformance suite over worlds that
// Init connects automatically, the ranks (goroutines) playing two hosts:
// even ranks on one, odd ranks on the other. A world of one runs over
// shared memory, of two over TCP (a rank per host), of three and four over
// both, with the hierarchical all-reduce.
func TestHostsConformance(t *testing.T) {
	commtest.RunConformance(t, func(t *testing.T, n int, opts ...comm.Option) []*comm.ProcessGroup {
		st := store.NewMemory()
		t.Cleanup(func() { st.Close() })
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		pgs := make([]*comm.ProcessGroup, n)
		errs := make([]error, n)
		var wg sync.WaitGroup
		for r := range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				pgs[r], errs[r] = comm.Init(ctx, "env://", comm.WithStore(st), comm.WithRank(r), comm.WithWorldSize(n),
					comm.WithBackend(comm.AutoBackend), comm.WithHostID(fmt.Sprint("host", r%2)), comm.WithToken("conformance"),
					comm.WithoutDefault(), comm.WithGroupOptions(opts...))
			}()
		}
		wg.Wait()
		for r, err := range errs {
			if err != nil {
				for _, pg := range pgs {
					if pg != nil {
						pg.Close()
					}
				}
				t.Fatalf("rank %d: %v", r, err)
			}
		}
		return pgs
	})
}
