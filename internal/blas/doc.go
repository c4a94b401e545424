// Package blas is the one place where Tandem's dense matrix products pick
// their BLAS. By default it is gonum's pure-Go implementation, so everything
// builds with no C toolchain and no CUDA, except for the float32 matrix
// product (SGEMM), which on amd64 processors with AVX and FMA runs in
// package sgemm's assembly kernels: 6x16 tiles of C from packed panels; for
// A·Bᵀ (a Linear layer's forward pass) of a batch of 16 to 256 rows, the
// same tiles of its transpose with B's rows read in place; and for other
// A·Bᵀ 3x4 blocks of dot products of rows, which need no packing. They run the MLP's training step about eight times
// faster than gonum's Go code does (12.8 ms against 102 ms on one core of
// the development machine, tandem bench train). Where the processor has
// AVX-512 (F and VL) and the operating system saves the ZMM and opmask
// state, the 512-bit kernels run instead, chosen at start-up: 8x32 tiles
// and 4x4 blocks of dot products sixteen terms an instruction, about 1.9
// times the AVX2 kernels' speed on the MLP's products and 1.8 times on its
// whole step (6.6 ms against 11.7 ms of CPU a step on a Xeon with AVX-512);
// Core tells which family runs. Float64 products, small products and other
// processors stay with gonum, and the purego build tag turns the kernels
// off. Built with the tag `openblas`
// (Debian's libopenblas-dev, through cgo) the level-2 and level-3 routines
// that training spends its time in (GEMM, GEMV) go to OpenBLAS, and the same
// implementation is installed into gorgonia and its tensor package, so
// gorgonia's own products and convolutions use it too (the default
// implementation is installed there as well). In that build the large float32
// products of a Linear layer (A·Bᵀ forward, Aᵀ·B and A·B backward) still
// run in package sgemm's AVX-512 kernels where the processor has them, and
// A·Bᵀ and Aᵀ·B in its AVX2 kernels where it has only those: they are
// faster than OpenBLAS's on those products, OpenBLAS on the small ones and
// the rest (see openBLAS.Sgemm).
//
//	go build -tags openblas ./...
//
// Name tells which one a binary carries. OpenBLAS is pinned to one thread:
// Tandem runs one rank a core and parallelises across ranks. Package
// sgemm's tiled products split among goroutines only as far as the
// processors go round the ranks on the host (sgemm.Threads,
// TANDEM_GEMM_THREADS).
package blas
