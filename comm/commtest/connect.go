package commtest

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/tandemml/tandem/comm"
	"github.com/tandemml/tandem/comm/store"
	"github.com/tandemml/tandem/comm/transport"
	"github.com/tandemml/tandem/internal/testkit"
)

// Connect returns the NewGroups of a backend whose ranks meet through a
// store (see Groups). A backend's conformance test is then
//
//	commtest.RunConformance(t, commtest.Connect(mybackend.NewBackend()))
func Connect(b transport.Backend) NewGroups {
	return func(t *testing.T, n int, opts ...comm.Option) []*comm.ProcessGroup {
		return Groups(t, b, n, opts...)
	}
}

// Groups makes a world of n process groups over backend b, for tests and
// benchmarks: each rank is a goroutine that connects its own transport with
// b through one in-memory store (token "conformance", 30 s to connect) and
// makes the world group over it with opts. It fails t if any rank cannot,
// and closes the groups when t ends.
func Groups(t testing.TB, b transport.Backend, n int, opts ...comm.Option) []*comm.ProcessGroup {
	t.Helper()
	st := store.NewMemory()
	t.Cleanup(func() { st.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	pgs := make([]*comm.ProcessGroup, n)
	errs := testkit.EachRank(n, func(r int) error {
		tr, err := b.Connect(ctx, transport.Config{Rank: r, Size: n, Store: st, Token: "conformance"})
		if err != nil {
			return err
		}
		pgs[r], err = comm.NewProcessGroup(ctx, tr, opts...)
		if err != nil {
			tr.Close()
		}
		return err
	})
	closeOnCleanup(t, pgs)
	for r, err := range errs {
		require.NoErrorf(t, err, "rank %d", r)
	}
	return pgs
}

// InitGroups makes a world of n process groups the way a job does, with
// comm.Init("env://") on every rank at once (each a goroutine), meeting
// through one in-memory store, without a default group: rank r's options
// are the store, rank and world size, then opts(r) (may be nil). It fails
// t if any rank cannot join within 30 s, and closes the groups when t ends.
func InitGroups(t testing.TB, n int, opts func(rank int) []comm.InitOption) []*comm.ProcessGroup {
	t.Helper()
	st := store.NewMemory()
	t.Cleanup(func() { st.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	pgs := make([]*comm.ProcessGroup, n)
	errs := testkit.EachRank(n, func(r int) error {
		o := []comm.InitOption{comm.WithStore(st), comm.WithRank(r), comm.WithWorldSize(n), comm.WithoutDefault()}
		if opts != nil {
			o = append(o, opts(r)...)
		}
		var err error
		pgs[r], err = comm.Init(ctx, "env://", o...)
		return err
	})
	closeOnCleanup(t, pgs)
	for r, err := range errs {
		require.NoErrorf(t, err, "rank %d", r)
	}
	return pgs
}

// closeOnCleanup closes every group of pgs that was made, concurrently (a
// world's ranks close together), when t ends.
func closeOnCleanup(t testing.TB, pgs []*comm.ProcessGroup) {
	t.Cleanup(func() {
		var wg sync.WaitGroup
		for _, pg := range pgs {
			if pg != nil {
				wg.Go(func() { pg.Close() })
			}
		}
		wg.Wait()
	})
}
