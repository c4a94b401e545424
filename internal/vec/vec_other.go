//go:build !amd64 || purego

package vec

// haveAVX is false: this build has no kernels, and the plain loops run.
const haveAVX = false

func addAVX(dst, x, y *float32, n int)     { panic("vec: unreachable: haveAVX is false in this build") }
func mulAVX(dst, x, y *float32, n int)     { panic("vec: unreachable: haveAVX is false in this build") }
func addReLUAVX(dst, x, y *float32, n int) { panic("vec: unreachable: haveAVX is false in this build") }
func addToAVX(dst, x *float32, n int)      { panic("vec: unreachable: haveAVX is false in this build") }
func reluMaskAVX(dst, x, dy *float32, n int) {
	panic("vec: unreachable: haveAVX is false in this build")
}
