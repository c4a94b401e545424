package comm

// Vector loops in kernels_amd64.s. Each computes dst[i] = dst[i] op src[i]
// for i < len(dst); src must be at least as long as dst.

//go:noescape
func addF32(dst, src []float32)

//go:noescape
func mulF32(dst, src []float32)

//go:noescape
func addF64(dst, src []float64)

//go:noescape
func mulF64(dst, src []float64)
