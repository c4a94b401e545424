// Package cudablas is the float32 matrix product on the GPU: cuBLAS's
// SGEMM on device buffers of comm/devstage's CUDA device, with the
// row-major argument convention of internal/blas.Sgemm, on the device's
// staging stream, so that a buffer staged for a collective after a product
// holds the product.
//
// Built only with the tandemcuda tag. It has been compiled and linked
// against CUDA 11.8's cuBLAS; it has never run on a GPU, and its test
// (TestSgemmMatchesCPU) has only been built.
//
// Without the tag the package is empty.
package cudablas
