//go:build !openblas

package blas

// Name names the BLAS compiled into this binary.
const Name = "gonum"

var impl Implementation = pure{}

// Default returns the BLAS this binary uses.
func Default() Implementation { return impl }

// Core names the kernel family in use; the pure-Go BLAS has one.
func Core() string { return "go" }
