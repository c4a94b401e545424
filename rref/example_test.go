package rref_test

import (
	"context"
	"fmt"
	"sync"

	"github.com/tandemml/tandem/comm/store"
	"github.com/tandemml/tandem/rpc"
	"github.com/tandemml/tandem/rref"
)

// Accumulator lives on its owner; users call its methods through RRefs.
type Accumulator struct {
	mu  sync.Mutex
	Sum float64
}

func (a *Accumulator) Add(x float64) float64 {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.Sum += x
	return a.Sum
}

func Example() {
	reg := rpc.NewRegistry()
	rpc.Register(reg, "accumulator.new", func(ctx context.Context, start float64) (*Accumulator, error) {
		return &Accumulator{Sum: start}, nil
	})
	// Two workers in one process for the example; a real program starts one
	// per process with rpc.InitFromEnv.
	st := store.NewMemory()
	agents := make([]*rpc.Agent, 2)
	var wg sync.WaitGroup
	for r := range agents {
		wg.Add(1)
		go func() {
			defer wg.Done()
			agents[r], _ = rpc.Init(context.Background(), fmt.Sprintf("worker%d", r), r, 2, rpc.WithStore(st), rpc.WithRegistry(reg), rpc.WithExtensions(rref.Extension()))
		}()
	}
	wg.Wait()

	ctx := context.Background()
	// Create the accumulator on worker1; the reference comes back at once.
	ref, _ := rref.Remote[*Accumulator](ctx, agents[0], "worker1", "accumulator.new", 1.0)
	fmt.Println("owner:", ref.Owner().Name, "is owner here:", ref.IsOwner())
	// Run a method where the value lives.
	sum, _ := rref.Call[float64](ctx, ref, "Add", 2.5)
	fmt.Println("sum on the owner:", sum)
	// Fetch a copy.
	acc, _ := ref.ToHere(ctx)
	fmt.Println("copy here:", acc.Sum)
	// Release it: the owner deletes the value once every user has.
	ref.Release(ctx)

	for _, a := range agents {
		wg.Add(1)
		go func() {
			defer wg.Done()
			a.Shutdown(ctx)
		}()
	}
	wg.Wait()
	// Output:
	// owner: worker1 is owner here: false
	// sum on the owner: 3.5
	// copy here: 3.5
}
