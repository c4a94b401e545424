//go:build !openblas && (!amd64 || purego)

package blas

// goFast is gonum's BLAS as it is where the tiled product is not built.
type goFast struct{ pure }

// fastCore is "": there are no kernels here.
func fastCore() string { return "" }
