//go:build tandemcuda

package cudamlp_test

import (
	"context"
	"math"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/tandemml/tandem/comm/devstage"
	"github.com/tandemml/tandem/comm/local"
	"github.com/tandemml/tandem/models"
	"github.com/tandemml/tandem/models/cudamlp"
	"gorgonia.org/tensor"
)

// TestDDPMatchesConcatenatedBatch trains one MLP on GPU 0 over two ranks
// (goroutines over comm/local, each with its own context stream and half of
// every batch, the gradients averaged through a Stager) and the same MLP in
// one Step on the whole batches, for 50 SGD steps, and compares the
// parameters to float32 tolerance. It needs a GPU.
func TestDDPMatchesConcatenatedBatch(t *testing.T) {
	const half, steps, lr = 16, 50, 0.05
	sizes := []int{32, 64, 10}
	rng := rand.New(rand.NewPCG(5, 6))
	model, err := models.NewMLP(sizes, models.WithRand(rng), models.WithDtype(tensor.Float32))
	if err != nil {
		t.Fatal(err)
	}
	var init []*tensor.Dense
	for _, p := range model.Params() {
		init = append(init, p.Value)
	}
	xs := make([][]float32, steps)
	ys := make([][]int64, steps)
	for i := range xs {
		xs[i] = make([]float32, 2*half*sizes[0])
		for j := range xs[i] {
			xs[i][j] = float32(rng.NormFloat64())
		}
		ys[i] = make([]int64, 2*half)
		for j := range ys[i] {
			ys[i][j] = int64(rng.IntN(sizes[len(sizes)-1]))
		}
	}

	dev, err := devstage.NewCUDA(0)
	if err != nil {
		t.Fatal(err)
	}
	defer dev.Close()
	whole, err := cudamlp.New(dev, sizes, 2*half, init)
	if err != nil {
		t.Fatal(err)
	}
	defer whole.Close()
	for i := 0; i < steps; i++ {
		if _, err := whole.Grads(xs[i], ys[i]); err != nil {
			t.Fatal(err)
		}
		if err := whole.SGD(lr); err != nil {
			t.Fatal(err)
		}
	}
	want, err := whole.Params()
	if err != nil {
		t.Fatal(err)
	}

	pgs, err := local.NewGroups(context.Background(), 2)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		for _, pg := range pgs {
			pg.Close()
		}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	got := make([][]*tensor.Dense, 2)
	errs := make([]error, 2)
	var wg sync.WaitGroup
	for r := 0; r < 2; r++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[r] = func() error {
				rdev, err := devstage.NewCUDA(0)
				if err != nil {
					return err
				}
				defer rdev.Close()
				step, err := cudamlp.New(rdev, sizes, half, init)
				if err != nil {
					return err
				}
				defer step.Close()
				st, err := devstage.New(rdev, devstage.WithChunkBytes(16<<10))
				if err != nil {
					return err
				}
				defer st.Close()
				for i := 0; i < steps; i++ {
					x := xs[i][r*half*sizes[0] : (r+1)*half*sizes[0]]
					y := ys[i][r*half : (r+1)*half]
					if _, err := step.Grads(x, y); err != nil {
						return err
					}
					if err := step.AllReduceGrads(ctx, st, pgs[r]); err != nil {
						return err
					}
					if err := step.SGD(lr); err != nil {
						return err
					}
				}
				got[r], err = step.Params()
				return err
			}()
		}()
	}
	wg.Wait()
	for r, err := range errs {
		if err != nil {
			t.Fatalf("rank %d: %v", r, err)
		}
	}
	for r := range got {
		for i, w := range want {
			a, b := got[r][i].Data().([]float32), w.Data().([]float32)
			for j := range b {
				if math.Abs(float64(a[j]-b[j])) > 1e-4 {
					t.Fatalf("rank %d, parameter %d, element %d: DDP %v, one step on the whole batch %v", r, i, j, a[j], b[j])
				}
			}
		}
	}
}
