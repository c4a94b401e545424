// Package sgemm computes float32 matrix products, C = alpha·op(A)·op(B) +
// beta·C on row-major matrices, in Tandem's vector kernels for amd64: the
// AVX2/FMA family (6x16 tiles of C from packed panels; for A·Bᵀ, a
// Linear layer's forward pass, of a batch of rows, the tiles of (B·Aᵀ)ᵀ
// with B's rows broadcast where they lie, only A packed; and for other
// A·Bᵀ 3x4 blocks of dot products of rows, which need no packing) and, where the processor has AVX-512 (F and VL) and the
// operating system saves the ZMM and opmask state, the 512-bit family (8x32
// tiles, 4x4 blocks of dot products sixteen terms an instruction), chosen
// at start-up; Core tells which. Products that do not pay for the kernels,
// other processors and the purego build tag are left to the caller: Gemm
// then reports false.
//
// It is its own package, with no cgo, because Go assembly cannot live in a
// package that uses cgo, and package blas does in its OpenBLAS build, which
// uses these kernels too (see blas.openBLAS.Sgemm).
package sgemm
