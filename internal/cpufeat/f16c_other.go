//go:build !amd64 || purego

package cpufeat

// F16C is false where the assembly kernels are not built.
const F16C = false
