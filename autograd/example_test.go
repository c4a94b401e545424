package autograd_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"

	G "gorgonia.org/gorgonia"
	"gorgonia.org/tensor"

	"github.com/tandemml/tandem/autograd"
	"github.com/tandemml/tandem/comm/store"
	"github.com/tandemml/tandem/models"
	"github.com/tandemml/tandem/rpc"
)

// A linear layer lives on worker "ps"; the trainer runs it remotely,
// computes the loss locally and trains it with distributed autograd and a
// distributed optimizer.
func Example() {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	// Every worker registers the constructors it may be asked to run.
	reg := rpc.NewRegistry()
	autograd.RegisterModule(reg, "linear.new", func(ctx context.Context, sizes []int) (models.Module, error) {
		return models.NewLinear(sizes[0], sizes[1], models.WithRand(rand.New(rand.NewPCG(1, 2))), models.WithDtype(tensor.Float64))
	})

	// Two workers in this process (one per process in real jobs).
	st := store.NewMemory()
	defer st.Close()
	agents := make([]*rpc.Agent, 2)
	var wg sync.WaitGroup
	for r, name := range []string{"trainer", "ps"} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			agents[r], _ = rpc.Init(ctx, name, r, 2, rpc.WithStore(st), rpc.WithRegistry(reg), rpc.WithListenAddr("127.0.0.1:0"), rpc.WithExtensions(autograd.Extension()))
		}()
	}
	wg.Wait()
	trainer := agents[0]
	defer func() {
		for _, a := range agents {
			a.Close()
		}
	}()

	layer, err := autograd.NewRemoteModule(ctx, trainer, "ps", "linear.new", []int{2, 1})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer layer.Close(ctx)
	params, _ := layer.ParameterRRefs(ctx)
	opt, err := autograd.NewDistributedOptimizer(ctx, trainer, "sgd", map[string]any{"lr": 0.1}, params)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer opt.Close(ctx)
	mse := autograd.NewFunction("mse", func(b *models.Builder, in []*G.Node) ([]*G.Node, error) {
		l, err := models.MSE(in[0], in[1])
		return []*G.Node{l}, err
	})

	// Learn y = x1 - x2.
	x := tensor.New(tensor.WithShape(4, 2), tensor.WithBacking([]float64{1, 0, 0, 1, 1, 1, 2, 1}))
	y := tensor.New(tensor.WithShape(4, 1), tensor.WithBacking([]float64{1, -1, 0, 1}))
	var first, last float64
	for step := 0; step < 200; step++ {
		err := autograd.WithContext(ctx, trainer, func(ctx context.Context, c *autograd.Context) error {
			pred, err := layer.Forward(ctx, c, x) // runs on "ps", recorded in c
			if err != nil {
				return err
			}
			loss, err := mse.Apply(ctx, c, pred, y) // runs here, recorded in c
			if err != nil {
				return err
			}
			if step == 0 {
				first = loss[0].Float64s()[0]
			}
			last = loss[0].Float64s()[0]
			if err := c.Backward(ctx, loss[0]); err != nil { // reaches "ps"
				return err
			}
			return opt.Step(ctx, c.ID()) // updates the weights on "ps"
		})
		if err != nil {
			fmt.Println(err)
			return
		}
	}
	fmt.Printf("loss fell from %.2f to below 0.01: %v\n", first, last < 0.01)
	// Output: loss fell from 0.45 to below 0.01: true
}
