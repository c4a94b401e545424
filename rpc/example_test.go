package rpc_test

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/tandemml/tandem/comm/store"
	"github.com/tandemml/tandem/rpc"
	"gorgonia.org/tensor"
)

// startWorkers starts n workers in this process for the examples; a real
// program starts one per process with rpc.InitFromEnv.
func startWorkers(n int, reg *rpc.Registry) []*rpc.Agent {
	st := store.NewMemory()
	agents := make([]*rpc.Agent, n)
	var wg sync.WaitGroup
	for r := range agents {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var err error
			agents[r], err = rpc.Init(context.Background(), fmt.Sprintf("worker%d", r), r, n, rpc.WithStore(st), rpc.WithRegistry(reg))
			if err != nil {
				panic(err)
			}
		}()
	}
	wg.Wait()
	return agents
}

func stopWorkers(agents []*rpc.Agent) {
	var wg sync.WaitGroup
	for _, a := range agents {
		wg.Add(1)
		go func() {
			defer wg.Done()
			a.Shutdown(context.Background())
		}()
	}
	wg.Wait()
}

func Example() {
	reg := rpc.NewRegistry()
	rpc.Register(reg, "scale", func(ctx context.Context, x *tensor.Dense) (*tensor.Dense, error) {
		return x.MulScalar(float32(2), true)
	})
	agents := startWorkers(2, reg)
	defer stopWorkers(agents)

	ctx := context.Background()
	x := tensor.New(tensor.WithShape(3), tensor.WithBacking([]float32{1, 2, 3}))
	y, err := rpc.Sync[*tensor.Dense](ctx, agents[0], "worker1", "scale", x)
	fmt.Println(y.Data(), err)
	// Output: [2 4 6] <nil>
}

func ExampleAsync() {
	type pair struct{ A, B int }
	reg := rpc.NewRegistry()
	rpc.Register(reg, "add", func(ctx context.Context, p pair) (int, error) { return p.A + p.B, nil })
	agents := startWorkers(2, reg)
	defer stopWorkers(agents)

	ctx := context.Background()
	var futs []*rpc.Future[int]
	for i := 0; i < 4; i++ {
		futs = append(futs, rpc.Async[int](ctx, agents[0], "worker1", "add", pair{i, 10}))
	}
	for _, f := range futs {
		v, _ := f.Wait(ctx)
		fmt.Print(v, " ")
	}
	fmt.Println()
	// Output: 10 11 12 13
}

func ExampleRegisterAsync() {
	reg := rpc.NewRegistry()
	// An async function hands back a future at once; the reply goes out when
	// the future completes (here, from another goroutine), and no goroutine
	// of the agent waits meanwhile.
	rpc.RegisterAsync(reg, "square", func(ctx context.Context, x int) *rpc.Future[int] {
		f := rpc.NewFuture[int]()
		go f.Complete(x*x, nil)
		return f
	})
	agents := startWorkers(2, reg)
	defer stopWorkers(agents)

	v, err := rpc.Sync[int](context.Background(), agents[0], "worker1", "square", 7)
	fmt.Println(v, err)
	// Output: 49 <nil>
}

func ExampleRemoteError() {
	reg := rpc.NewRegistry()
	rpc.Register(reg, "check", func(ctx context.Context, n int) (int, error) {
		if n < 0 {
			return 0, fmt.Errorf("negative input %d", n)
		}
		return n, nil
	})
	agents := startWorkers(2, reg)
	defer stopWorkers(agents)

	ctx := context.Background()
	_, err := rpc.Sync[int](ctx, agents[0], "worker1", "check", -1)
	fmt.Println(errors.Is(err, rpc.ErrRemote))
	fmt.Println(err)
	var ce *rpc.CallError
	var re *rpc.RemoteError
	if errors.As(err, &ce) && errors.As(err, &re) {
		fmt.Printf("op %s, worker %s, function %s; remote message %q\n", ce.Op, ce.Peer, ce.Func, re.Message)
	}
	_, err = rpc.Sync[int](ctx, agents[0], "worker1", "chek", 1)
	fmt.Println(errors.Is(err, rpc.ErrUnknownFunction))
	// Output:
	// true
	// rpc: call "check" on worker worker1: the function failed: negative input -1
	// op call, worker worker1, function check; remote message "negative input -1"
	// true
}

// A loop that sends and receives large tensors of one shape again and
// again reuses memory on both sides: the function promises to keep nothing
// of its argument (ReuseArgMemory), and the caller lends last round's
// result for the next (WithResultInto), so every copy lands in memory that
// is still in the CPU's caches.
func ExampleWithResultInto() {
	reg := rpc.NewRegistry()
	rpc.Register(reg, "negate", func(ctx context.Context, x *tensor.Dense) (*tensor.Dense, error) {
		for i, v := range x.Float32s() {
			x.Float32s()[i] = -v // in place: the reply carries the argument's memory back
		}
		return x, nil
	}, rpc.ReuseArgMemory())
	agents := startWorkers(2, reg)
	defer stopWorkers(agents)

	ctx := context.Background()
	x := tensor.New(tensor.WithShape(1<<20), tensor.WithBacking(make([]float32, 1<<20)))
	var y *tensor.Dense
	for step := 0; step < 3; step++ {
		x.Float32s()[0] = float32(step)
		var err error
		y, err = rpc.Sync[*tensor.Dense](ctx, agents[0], "worker1", "negate", x, rpc.WithResultInto(y))
		if err != nil {
			panic(err)
		}
		fmt.Println(y.Float32s()[0])
	}
	// Output:
	// -0
	// -1
	// -2
}
