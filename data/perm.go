package data

import (
	"math/bits"
	"math/rand/v2"
)

// permutation returns a random permutation of [0, n) determined by key alone.
// It draws from PCG-DXSM (math/rand/v2's PCG, whose output is fixed by its
// specification) and shuffles with Fisher-Yates and Lemire's unbiased bounded
// integers, all written here, so the order never changes with the Go release.
func permutation(n int, key uint64) []int {
	p := make([]int, n)
	for i := range p {
		p[i] = i
	}
	src := rand.NewPCG(key, 0x9e3779b97f4a7c15)
	for i := n - 1; i > 0; i-- {
		j := int(bounded(src, uint64(i+1)))
		p[i], p[j] = p[j], p[i]
	}
	return p
}

// bounded returns a uniform integer in [0, n) (n > 0).
func bounded(src *rand.PCG, n uint64) uint64 {
	for {
		hi, lo := bits.Mul64(src.Uint64(), n)
		if lo >= n || lo >= (-n)%n {
			return hi
		}
	}
}
