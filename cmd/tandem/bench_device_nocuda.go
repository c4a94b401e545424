//go:build !tandemcuda

package main

import "errors"

func cudaUnavailable() error {
	return errors.New("-device cuda: this tandem was built without -tags tandemcuda; see make check-cuda (it installs the CUDA toolkit's headers and builds with the tag)")
}
