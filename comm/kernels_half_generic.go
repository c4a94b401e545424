//go:build !amd64 || purego

package comm

func narrowF16(dst []uint16, src []float32) { narrowF16Go(dst, src) }
func widenF16(dst []float32, src []uint16)  { widenF16Go(dst, src) }

// useF16C is false: there is no F16C path in this build.
var useF16C = false
