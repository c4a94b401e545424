//go:build !amd64 || purego

package cpufeat

// AVX512 is false where the assembly kernels are not built.
const AVX512 = false
