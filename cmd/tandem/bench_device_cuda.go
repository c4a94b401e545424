//go:build tandemcuda

package main

import "errors"

// cudaUnavailable: the tag builds the staged device collectives
// (comm/devstage), not yet a GPU training step for these benchmarks.
func cudaUnavailable() error {
	return errors.New("-device cuda: this build has the CUDA device collectives (comm/devstage) but no GPU training step yet; the benchmarks run on the cpu only")
}
