//go:build !amd64 || purego

package comm

func widenF16(dst []float32, src []uint16)     { widenF16Go(dst, src) }
func narrowF16(dst []uint16, src []float32)    { narrowF16Go(dst, src) }
func addWidenF16(dst []float32, src []uint16)  { addWidenF16Go(dst, src) }
func widenBF16(dst []float32, src []uint16)    { widenBF16Go(dst, src) }
func narrowBF16(dst []uint16, src []float32)   { narrowBF16Go(dst, src) }
func addWidenBF16(dst []float32, src []uint16) { addWidenBF16Go(dst, src) }

// useF16C is false: there is no vector path in this build.
var useF16C = false
