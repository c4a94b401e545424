//go:build !amd64 || purego

package cpufeat

// AVX2F16C is false where the assembly kernels are not built.
const AVX2F16C = false
