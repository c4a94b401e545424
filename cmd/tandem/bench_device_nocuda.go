//go:build !tandemcuda

package main

import (
	"context"
	"errors"
	"time"

	"github.com/tandemml/tandem/comm"
	"github.com/tandemml/tandem/models"
)

func cudaUnavailable(string) error {
	return errors.New("-device cuda: this tandem was built without -tags tandemcuda; see make check-cuda (it installs the CUDA toolkit's headers and builds with the tag)")
}

// timeTrainStepsCUDA is not reached without the tag: checkDevice refuses
// -device cuda first.
func timeTrainStepsCUDA(context.Context, []int, int, int) (time.Duration, error) {
	return 0, cudaUnavailable("train")
}

// cudaDDPStep is not reached without the tag either.
func cudaDDPStep(context.Context, *comm.ProcessGroup, models.Module, []int, []float32, []int64, bool, float32) (func() (float64, error), func(), error) {
	return nil, nil, cudaUnavailable("ddp")
}
