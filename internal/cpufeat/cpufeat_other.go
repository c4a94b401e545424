//go:build !amd64 || purego

package cpufeat

// FMA is false where the assembly kernels are not built.
const FMA = false
