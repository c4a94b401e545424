//go:build tandemcuda

package main

import (
	"context"
	"errors"
	"math/rand/v2"
	"time"

	"github.com/tandemml/tandem/comm"
	"github.com/tandemml/tandem/comm/devstage"
	"github.com/tandemml/tandem/models"
	"github.com/tandemml/tandem/models/cudamlp"
	"gorgonia.org/tensor"
)

// cudaUnavailable: bench train and bench ddp have GPU steps
// (models/cudamlp) in this build.
func cudaUnavailable(bench string) error {
	if bench == "train" || bench == "ddp" {
		return nil
	}
	return errors.New("-device cuda: tandem bench " + bench + " has no GPU path")
}

// cudaDDPStep returns a worker's training step on GPU 0 (every rank of the
// benchmark shares it): models/cudamlp's step from the model's initial
// parameters on the rank's batch x, y, its gradients averaged across pg
// through a devstage.Stager when useDDP, then SGD with lr. done frees the
// device's resources.
func cudaDDPStep(ctx context.Context, pg *comm.ProcessGroup, model models.Module, sizes []int, x []float32, y []int64, useDDP bool, lr float32) (func() (float64, error), func(), error) {
	var params []*tensor.Dense
	for _, p := range model.Params() {
		params = append(params, p.Value)
	}
	dev, err := devstage.NewCUDA(0)
	if err != nil {
		return nil, nil, err
	}
	step, err := cudamlp.New(dev, sizes, len(y), params)
	if err != nil {
		dev.Close()
		return nil, nil, err
	}
	st, err := devstage.New(dev)
	if err != nil {
		step.Close()
		dev.Close()
		return nil, nil, err
	}
	done := func() {
		st.Close()
		step.Close()
		dev.Close()
	}
	run := func() (float64, error) {
		loss, err := step.Grads(x, y)
		if err != nil {
			return 0, err
		}
		if useDDP {
			if err := step.AllReduceGrads(ctx, st, pg); err != nil {
				return 0, err
			}
		}
		return loss, step.SGD(lr)
	}
	return run, done, nil
}

// timeTrainStepsCUDA times the MLP step of models/cudamlp on GPU 0, with
// the parameters models.NewMLP draws for the CPU step and one random batch,
// as timeTrainSteps does: the median wall time of steps timed steps (each
// ends with the loss read back, so it includes the device's work) after ten
// warm-up steps.
func timeTrainStepsCUDA(ctx context.Context, sizes []int, batch, steps int) (time.Duration, error) {
	rng := rand.New(rand.NewPCG(0, 1))
	model, err := models.NewMLP(sizes, models.WithRand(rng), models.WithDtype(tensor.Float32))
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
