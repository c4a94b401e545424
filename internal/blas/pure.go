//go:build !openblas

package blas

import (
	G "gorgonia.org/gorgonia"
	"gorgonia.org/tensor"

	"github.com/tandemml/tandem/internal/blas/sgemm"
)

// Name names the BLAS compiled into this binary.
const Name = "gonum"

var impl Implementation = goFast{}

// gorgonia's own products and the tensor package use it too.
func init() {
	G.Use(impl)
	tensor.Use(impl)
}

// Default returns the BLAS this binary uses.
func Default() Implementation { return impl }

// Core names the kernel family in use: "go-avx512" where float32 matrix
// products run in package sgemm's AVX-512 kernels, "go-fma" where they run
// in its AVX2/FMA kernels, "go" where gonum's Go code does everything.
func Core() string {
	if c := sgemm.Core(); c != "" {
		return c
	}
	return "go"
}
