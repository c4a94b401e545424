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
// b through one in-memory store (token "conformance") and makes the world
// group over it with opts. It fails t if any rank cannot within 30 s, and
// closes the groups when t ends.
func Groups(t testing.TB, b transport.Backend, n int, opts ...comm.Option) []*comm.ProcessGroup {
	t.Helper()
	return world(t, n, func(ctx context.Context, st store.Store, r int) (*comm.ProcessGroup, error) {
		tr, err := b.Connect(ctx, transport.Config{Rank: r, Size: n, Store: st, Token: "conformance"})
		if err != nil {
			return nil, err
		}
		pg, err := comm.NewProcessGroup(ctx, tr, opts...)
		if err != nil {
			tr.Close()
		}
		return pg, err
	})
}

// InitGroups makes a world of n process groups the way a job does, with
// comm.Init("env://") on every rank at once (each a goroutine), meeting
// through one in-memory store, without a default group: rank r's options
// are the store, rank and world size, then opts(r) (may be nil). It fails
// t if any rank cannot join within 30 s, and closes the groups when t ends.
func InitGroups(t testing.TB, n int, opts func(rank int) []comm.InitOption) []*comm.ProcessGroup {
	t.Helper()
	return world(t, n, func(ctx context.Context, st store.Store, r int) (*comm.ProcessGroup, error) {
		o := []comm.InitOption{comm.WithStore(st), comm.WithRank(r), comm.WithWorldSize(n), comm.WithoutDefault()}
		if opts != nil {
			o = append(o, opts(r)...)
		}
		return comm.Init(ctx, "env://", o...)
	})
}

// world runs join for every rank of a world of n at once, with a fresh
// in-memory store and 30 s, fails t if any rank's join failed, and closes
// the groups made when t ends (a world's ranks close together).
func world(t testing.TB, n int, join func(ctx context.Context, st store.Store, rank int) (*comm.ProcessGroup, error)) []*comm.ProcessGroup {
	t.Helper()
	st := store.NewMemory()
	t.Cleanup(func() { st.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	pgs := make([]*comm.ProcessGroup, n)
	errs := testkit.EachRank(n, func(r int) (err error) {
		pgs[r], err = join(ctx, st, r)
		return err
	})
	t.Cleanup(func() {
		var wg sync.WaitGroup
		for _, pg := range pgs {
			if pg != nil {
				wg.Go(func() { pg.Close() })
			}
		}
		wg.Wait()
	})
	for r, err := range errs {
		require.NoErrorf(t, err, "rank %d", r)
	}
	return pgs
}
