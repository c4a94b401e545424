//go:build amd64 && !purego

package vec

import "github.com/tandemml/tandem/internal/cpufeat"

// haveAVX: the processor and the operating system run AVX (cpufeat.FMA
// checks AVX and the YMM state along with FMA, which every processor with
// AVX2 has).
var haveAVX = cpufeat.FMA

// The kernels take n, a positive multiple of 8, elements from each pointer.

//go:noescape
func addAVX(dst, x, y *float32, n int)

//go:noescape
func mulAVX(dst, x, y *float32, n int)

//go:noescape
func addReLUAVX(dst, x, y *float32, n int)

//go:noescape
func addToAVX(dst, x *float32, n int)

//go:noescape
func reluMaskAVX(dst, x, dy *float32, n int)
