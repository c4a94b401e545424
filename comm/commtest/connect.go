package commtest

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/tandemml/tandem/comm"
	"github.com/tandemml/tandem/comm/store"
	"github.com/tandemml/tandem/comm/transport"
)

// Connect returns the NewGroups of a backend whose ranks meet through a
// store: each of the n ranks is a goroutine that connects its own
// transport with b through one in-memory store (token "conformance") and
// makes the world group over it. A backend's conformance test is then
//
//	commtest.RunConformance(t, commtest.Connect(mybackend.NewBackend()))
func Connect(b transport.Backend) NewGroups {
	return func(t *testing.T, n int, opts ...comm.Option) []*comm.ProcessGroup {
		st := store.NewMemory()
		t.Cleanup(func() { st.Close() })
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		pgs := make([]*comm.ProcessGroup, n)
		errs := make([]error, n)
		var wg sync.WaitGroup
		for r := 0; r < n; r++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				tr, err := b.Connect(ctx, transport.Config{Rank: r, Size: n, Store: st, Token: "conformance"})
				if err != nil {
					errs[r] = err
					return
				}
				pgs[r], errs[r] = comm.NewProcessGroup(ctx, tr, opts...)
				if errs[r] != nil {
					tr.Close()
				}
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
	}
}
