package comm

import (
	"context"
	"net"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/tandemml/tandem/comm/store"
	"gorgonia.org/tensor"
)

// Under an elastic tandem run, TANDEM_STORE_PREFIX says that the store at
// MASTER_ADDR:MASTER_PORT is already served (by `tandem store`): no rank
// serves one, every rank dials it with the token and meets under the
// prefix, so two rounds of the same ranks in one store do not collide.
func TestInitFromEnvMeetsUnderRoundPrefix(t *testing.T) {
	const token = "round-store-token"
	srv, err := store.NewServer("127.0.0.1:0", store.WithToken(token))
	if err != nil {
		t.Fatal(err)
	}
	sctx, stop := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- srv.Serve(sctx) }()
	defer func() {
		stop()
		if err := <-served; err != nil {
			t.Error(err)
		}
	}()
	host, port, _ := net.SplitHostPort(srv.Addr())
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	for round := range 2 {
		prefix := "job1/round/" + strconv.Itoa(round)
		const world = 3
		sums := make([]float64, world)
		var wg sync.WaitGroup
		for r := range world {
			wg.Go(func() {
				env := map[string]string{
					"RANK": strconv.Itoa(r), "WORLD_SIZE": strconv.Itoa(world), "LOCAL_RANK": strconv.Itoa(r), "LOCAL_WORLD_SIZE": strconv.Itoa(world),
					"MASTER_ADDR": host, "MASTER_PORT": port, "TANDEM_TOKEN": token,
					"TANDEM_RESTART_COUNT": strconv.Itoa(round), "TANDEM_STORE_PREFIX": prefix,
				}
				pg, err := InitFromEnv(ctx, withLookupEnv(lookupMap(env)), WithoutDefault())
				if err != nil {
					t.Errorf("round %d rank %d: %v", round, r, err)
					return
				}
				defer pg.Close()
				x := tensor.New(tensor.WithShape(1), tensor.WithBacking([]float64{float64(r + 1)}))
				if err := pg.AllReduce(ctx, x, Sum).Wait(ctx); err != nil {
					t.Errorf("round %d rank %d: %v", round, r, err)
					return
				}
				sums[r] = x.Data().([]float64)[0]
			})
		}
		wg.Wait()
		for r, s := range sums {
			if s != 6 {
				t.Errorf("round %d rank %d: sum %v, want 6", round, r, s)
			}
		}
		// The ranks met under the round's prefix of the served store.
		c, err := store.Dial(ctx, srv.Addr(), store.WithToken(token))
		if err != nil {
			t.Fatal(err)
		}
		ok, err := c.Check(ctx, []string{prefix + "/tandem/rdzv/rank/0"})
		c.Close()
		if err != nil || !ok {
			t.Errorf("round %d: no rank 0 key under %s in the served store (%v)", round, prefix, err)
		}
	}
}
