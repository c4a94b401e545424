//go:build openblas

package blas

import (
	"fmt"
	"math/rand/v2"
	"testing"

	gblas "gonum.org/v1/gonum/blas"

	"github.com/tandemml/tandem/internal/blas/sgemm"
)

// BenchmarkMLPProducts times each product of the MLP 784-1024-1024-10's
// step at batch 64 in OpenBLAS and in package sgemm's kernels, side by
// side under each shape so that -count rounds interleave them ("MB/s" is
// Mflop/s): the figures Sgemm's choice between them rests on.
func BenchmarkMLPProducts(b *testing.B) {
	rng := rand.New(rand.NewPCG(31, 32))
	for _, g := range mlpProducts([]int{784, 1024, 1024, 10}, 64) {
		lda, ldb := g.k, g.n
		if g.transA {
			lda = g.m
		}
		if g.transB {
			ldb = g.k
		}
		a, w, c := randF32(rng, g.m*g.k), randF32(rng, g.k*g.n), make([]float32, g.m*g.n)
		tA, tB := gblas.NoTrans, gblas.NoTrans
		if g.transA {
			tA = gblas.Trans
		}
		if g.transB {
			tB = gblas.Trans
		}
		for _, beta := range []float32{0, 1} {
			shape := fmt.Sprintf("%s_%dx%dx%d_beta%v", g.name, g.m, g.n, g.k, beta)
			b.Run(shape+"/openblas", func(b *testing.B) {
				b.SetBytes(int64(2 * g.m * g.n * g.k))
				for b.Loop() {
					cblasSgemm(tA, tB, g.m, g.n, g.k, 1, a, lda, w, ldb, beta, c, g.n)
				}
			})
			b.Run(shape+"/"+sgemm.Core(), func(b *testing.B) {
				b.SetBytes(int64(2 * g.m * g.n * g.k))
				for b.Loop() {
					sgemm.Gemm(g.transA, g.transB, g.m, g.n, g.k, 1, a, lda, w, ldb, beta, c, g.n)
				}
			})
		}
	}
}

// mlpProduct is one matrix product of an MLP's training step.
type mlpProduct struct {
	name           string
	transA, transB bool
	m, n, k        int
}

// mlpProducts lists the products of one training step of an MLP with the
// given layer sizes at the given batch, as a Linear layer and its
// gradients call them: each layer's forward x·Wᵀ, its weight gradient
// dYᵀ·X and, past the first layer, its input gradient dY·W.
func mlpProducts(sizes []int, batch int) []mlpProduct {
	var out []mlpProduct
	for l := 1; l < len(sizes); l++ {
		in, o := sizes[l-1], sizes[l]
		out = append(out,
			mlpProduct{fmt.Sprintf("fwd%d", l), false, true, batch, o, in},
			mlpProduct{fmt.Sprintf("dW%d", l), true, false, o, in, batch})
		if l > 1 {
			out = append(out, mlpProduct{fmt.Sprintf("dX%d", l), false, false, batch, in, o})
		}
	}
	return out
}
