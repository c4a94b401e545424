//go:build tandemcuda

package cudablas_test

import (
	"fmt"
	"math"
	"testing"
	"unsafe"

	"github.com/tandemml/tandem/comm/devstage"
	tblas "github.com/tandemml/tandem/internal/blas"
	"github.com/tandemml/tandem/internal/cudablas"
	gblas "gonum.org/v1/gonum/blas"
	"gorgonia.org/tensor"
)

func bytesOf(s []float32) []byte { return unsafe.Slice((*byte)(unsafe.Pointer(&s[0])), 4*len(s)) }

// TestSgemmMatchesCPU compares cuBLAS's products with internal/blas's for
// every transpose combination, on shapes of an MLP layer (the forward pass
// A·Wᵀ, and the two products of its backward pass). It needs a GPU.
func TestSgemmMatchesCPU(t *testing.T) {
	dev, err := devstage.NewCUDA(0)
	if err != nil {
		t.Fatal(err)
	}
	defer dev.Close()
	bl, err := cudablas.New(dev)
	if err != nil {
		t.Fatal(err)
	}
	defer bl.Close()
	upload := func(s []float32) *devstage.CUDABuffer {
		b, err := dev.AllocBuffer(tensor.Float32, len(s))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { dev.Free(b) })
		if err := dev.Write(b, 0, bytesOf(s)); err != nil {
			t.Fatal(err)
		}
		return b
	}
	for _, sh := range []struct{ m, n, k int }{{64, 1024, 784}, {1024, 784, 64}, {3, 5, 7}} {
		for _, tA := range []bool{false, true} {
			for _, tB := range []bool{false, true} {
				t.Run(fmt.Sprintf("%dx%dx%d/tA=%v/tB=%v", sh.m, sh.n, sh.k, tA, tB), func(t *testing.T) {
					m, n, k := sh.m, sh.n, sh.k
					a := make([]float32, m*k)
					b := make([]float32, k*n)
					c := make([]float32, m*n)
					for i := range a {
						a[i] = float32((i*7)%13-6) / 8
					}
					for i := range b {
						b[i] = float32((i*5)%11-5) / 8
					}
					for i := range c {
						c[i] = float32(i%3) / 4
					}
					lda, ldb := k, n
					if tA {
						lda = m
					}
					if tB {
						ldb = k
					}
					da, db, dc := upload(a), upload(b), upload(c)
					if err := bl.Sgemm(tA, tB, m, n, k, 0.5, da, lda, db, ldb, 2, dc, n); err != nil {
						t.Fatal(err)
					}
					got := make([]float32, m*n)
					if err := dev.Read(bytesOf(got), dc, 0); err != nil {
						t.Fatal(err)
					}
					op := func(tr bool) gblas.Transpose {
						if tr {
							return gblas.Trans
						}
						return gblas.NoTrans
					}
					tblas.Sgemm(op(tA), op(tB), m, n, k, 0.5, a, lda, b, ldb, 2, c, n)
					for i := range c {
						if d := math.Abs(float64(got[i] - c[i])); d > 1e-4*float64(k) {
							t.Fatalf("element %d: cuBLAS %v, CPU %v", i, got[i], c[i])
						}
					}
				})
			}
		}
	}
}
