package shm_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/tandemml/tandem/comm"
	"github.com/tandemml/tandem/comm/commtest"
	"github.com/tandemml/tandem/comm/shm"
	"github.com/tandemml/tandem/comm/store"
	"github.com/tandemml/tandem/comm/transport"
)

// TestConformance runs comm's backend conformance suite over shared-memory
// transports: every rank is a goroutine owning its own transport, with its
// own mapping of the world's segment, its own readers and heartbeat. Small
// rings make the suite's larger messages stream through them in pieces.
func TestConformance(t *testing.T) {
	backend := shm.NewBackend(shm.WithRingBytes(64 << 10))
	commtest.RunConformance(t, func(t *testing.T, n int, opts ...comm.Option) []*comm.ProcessGroup {
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
				tr, err := backend.Connect(ctx, transport.Config{Rank: r, Size: n, Store: st, Token: "conformance"})
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
	})
}
