//go:build !tandemcuda

package main

import (
	"context"
	"errors"
	"time"
)

func cudaUnavailable(string) error {
	return errors.New("-device cuda: this tandem was built without -tags tandemcuda; see make check-cuda (it installs the CUDA toolkit's headers and builds with the tag)")
}

// timeTrainStepsCUDA is not reached without the tag: checkDevice refuses
// -device cuda first.
func timeTrainStepsCUDA(context.Context, []int, int, int) (time.Duration, error) {
	return 0, cudaUnavailable("train")
}
