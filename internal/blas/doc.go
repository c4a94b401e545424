// Package blas is the one place where Tandem's dense matrix products pick
// their BLAS. By default it is gonum's pure-Go implementation, so everything
// builds with no C toolchain and no CUDA. Built with the tag `openblas`
// (Debian's libopenblas-dev, through cgo) the level-2 and level-3 routines
// that training spends its time in (GEMM, GEMV) go to OpenBLAS, and the same
// implementation is installed into gorgonia and its tensor package, so
// gorgonia's own products and convolutions use it too.
//
//	go build -tags openblas ./...
//
// Name tells which one a binary carries. OpenBLAS is pinned to one thread:
// Tandem runs one rank a core and parallelises across ranks.
package blas
