package ddp

import (
	"context"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"gorgonia.org/tensor"

	"github.com/tandemml/tandem/comm/local"
	"github.com/tandemml/tandem/models"
)

// TestGradsComputedInBuckets: in a synchronized step the gradient of every
// Linear parameter is computed straight into its view of the bucket
// (PyTorch's gradient_as_bucket_view), through the graph executor's
// SetOutput: the gradient node's value is the view, not a copy.
func TestGradsComputedInBuckets(t *testing.T) {
	const world = 2
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	pgs, err := local.NewGroups(ctx, world)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		for _, pg := range pgs {
			pg.Close()
		}
	}()
	errs := make([]error, world)
	var wg sync.WaitGroup
	for r := range world {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[r] = func() error {
				model, err := models.NewMLP([]int{4, 6, 3}, models.WithRand(rand.New(rand.NewPCG(1, 2))), models.WithDtype(tensor.Float64))
				if err != nil {
					return err
				}
				d, err := New(ctx, pgs[r], model, BucketCapMB(0.0001))
				if err != nil {
					return err
				}
				x := tensor.New(tensor.WithShape(5, 4), tensor.WithBacking(make([]float64, 20)))
				for i := range x.Float64s() {
					x.Float64s()[i] = float64(i%7-3+r) / 4
				}
				y := tensor.New(tensor.WithShape(5), tensor.WithBacking([]int64{0, 1, 2, 1, 0}))
				for range 2 {
					if _, err := d.Step(ctx, x, y); err != nil {
						return err
					}
				}
				checked := 0
				for _, p := range d.progs.progs {
					for _, pi := range p.hooked {
						v := p.b.GradNode(d.params[pi]).Value()
						if view := d.view(pi); v.Uintptr() != view.Uintptr() || v.MemSize() != view.MemSize() {
							t.Errorf("rank %d: the gradient of %s is not computed in its bucket view", r, d.params[pi].Name)
						}
						checked++
					}
				}
				if checked != 4 {
					t.Errorf("rank %d: checked %d gradients, want 4", r, checked)
				}
				return nil
			}()
		}()
	}
	wg.Wait()
	for r, err := range errs {
		if err != nil {
			t.Fatalf("rank %d: %v", r, err)
		}
	}
}
