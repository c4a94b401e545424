package ddp_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"

	"gorgonia.org/tensor"

	"github.com/tandemml/tandem/comm"
	"github.com/tandemml/tandem/comm/local"
	"github.com/tandemml/tandem/ddp"
	"github.com/tandemml/tandem/models"
	"github.com/tandemml/tandem/optim"
)

// Two ranks (goroutines here; processes launched by `tandem run` in real
// use) train replicas of one MLP on different data. After every step both
// hold the same averaged gradients, so their weights stay identical.
func Example() {
	fmt.Println("replicas identical:", replicasAgree(2, train))
	// Output:
	// rank 0: 3 synchronized steps, gradients reduced in buckets
	// replicas identical: true
}

// replicasAgree runs train on every rank of an in-process group of world
// ranks, one goroutine each, and reports whether all the ranks ended with
// the same weights.
func replicasAgree(world int, train func(context.Context, *comm.ProcessGroup) []float64) bool {
	ctx := context.Background()
	pgs, err := local.NewGroups(ctx, world)
	if err != nil {
		panic(err)
	}
	defer func() {
		for _, pg := range pgs {
			pg.Close()
		}
	}()
	weights := make([][]float64, world)
	var wg sync.WaitGroup
	for rank := range world {
		wg.Add(1)
		go func() {
			defer wg.Done()
			weights[rank] = train(ctx, pgs[rank])
		}()
	}
	wg.Wait()
	for _, w := range weights[1:] {
		if !slices.Equal(w, weights[0]) {
			return false
		}
	}
	return true
}

// train is what every rank runs.
func train(ctx context.Context, pg *comm.ProcessGroup) []float64 {
	// Each rank may start from its own random weights: New copies rank 0's.
	rng := rand.New(rand.NewPCG(uint64(pg.Rank()), 1))
	model, err := models.NewMLP([]int{8, 16, 3}, models.WithRand(rng), models.WithDtype(tensor.Float64))
	if err != nil {
		panic(err)
	}
	net, err := ddp.New(ctx, pg, model, ddp.BucketCapMB(0.0003))
	if err != nil {
		panic(err)
	}
	opt, err := optim.NewSGD(net.Parameters(), optim.LR(0.1), optim.Momentum(0.9))
	if err != nil {
		panic(err)
	}
	for step := 0; step < 3; step++ {
		x, y := rankBatch(pg.Rank(), step)
		if _, err := net.Step(ctx, x, y); err != nil {
			panic(err)
		}
		if err := opt.Step(); err != nil {
			panic(err)
		}
	}
	if pg.Rank() == 0 {
		st := net.Stats()
		fmt.Printf("rank 0: %d synchronized steps, gradients reduced in buckets\n", st.Steps)
	}
	var w []float64
	for _, p := range net.Parameters() {
		w = append(w, p.Value.Float64s()...)
	}
	return w
}

// rankBatch is this rank's share of the data at a step: 4 examples of 8
// features with class labels.
func rankBatch(rank, step int) (*tensor.Dense, *tensor.Dense) {
	rng := rand.New(rand.NewPCG(uint64(rank), uint64(step)))
	x := make([]float64, 4*8)
	for i := range x {
		x[i] = rng.NormFloat64()
	}
	y := []int64{int64(rng.IntN(3)), int64(rng.IntN(3)), int64(rng.IntN(3)), int64(rng.IntN(3))}
	return tensor.New(tensor.WithShape(4, 8), tensor.WithBacking(x)), tensor.New(tensor.WithShape(4), tensor.WithBacking(y))
}
