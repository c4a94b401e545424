//go:build tandemcuda

package main

import (
	"context"
	"errors"
	"math/rand/v2"
	"time"

	"github.com/tandemml/tandem/comm/devstage"
	"github.com/tandemml/tandem/models"
	"github.com/tandemml/tandem/models/cudamlp"
	"gorgonia.org/tensor"
)

// cudaUnavailable: bench train has a GPU step (models/cudamlp); bench ddp
// does not run its ranks on the GPU yet.
func cudaUnavailable(bench string) error {
	if bench == "train" {
		return nil
	}
	return errors.New("-device cuda: tandem bench " + bench + " has no GPU path yet (the tandemcuda build has bench train's)")
}

// timeTrainStepsCUDA times the MLP step of models/cudamlp on GPU 0, with
// the parameters models.NewMLP draws for the CPU step and one random batch,
// as timeTrainSteps does: the median wall time of steps timed steps (each
// ends with the loss read back, so it includes the device's work) after ten
// warm-up steps.
func timeTrainStepsCUDA(ctx context.Context, sizes []int, batch, steps int) (time.Duration, error) {
	rng := rand.New(rand.NewPCG(0, 1))
	model, err := models.NewMLP(sizes, models.ActReLU, true, rng, models.WithDtype(tensor.Float32))
	if err != nil {
		return 0, err
	}
	var params []*tensor.Dense
	for _, p := range model.Params() {
		params = append(params, p.Value)
	}
	xs := make([]float32, batch*sizes[0])
	for i := range xs {
		xs[i] = float32(rng.NormFloat64())
	}
	ys := make([]int64, batch)
	for i := range ys {
		ys[i] = int64(rng.IntN(sizes[len(sizes)-1]))
	}
	dev, err := devstage.NewCUDA(0)
	if err != nil {
		return 0, err
	}
	defer dev.Close()
	step, err := cudamlp.New(dev, sizes, batch, params)
	if err != nil {
		return 0, err
	}
	defer step.Close()
	times := make([]time.Duration, 0, steps)
	for i := 0; i < steps+10; i++ {
		if err := ctx.Err(); err != nil {
			return 0, err
		}
		t0 := time.Now()
		if _, err := step.Grads(xs, ys); err != nil {
			return 0, err
		}
		if err := step.SGD(0.01); err != nil {
			return 0, err
		}
		if i >= 10 {
			times = append(times, time.Since(t0))
		}
	}
	return quantile(times, 0.5), nil
}
