//go:build linux

package comm

import (
	"context"
	"testing"
	"time"

	"gorgonia.org/tensor"

	"github.com/tandemml/tandem/internal/testkit"
)

// TestStagingUnavailable: where no staging segment can be made (here a
// missing directory; in a container, a full /dev/shm), every rank learns
// it on the group's first all-reduce, which, like the later ones, goes
// through the transport instead and is right; no rank tries again.
func TestStagingUnavailable(t *testing.T) {
	const n, elems = 3, 50000
	pgs := initHosts(t, n, nil, WithGroupOptions(WithSharedDir(t.TempDir()+"/missing")))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for round := range 2 {
		xs := make([]*tensor.Dense, n)
		errs := testkit.EachRank(n, func(r int) error {
			d := make([]float32, elems)
			for i := range d {
				d[i] = float32(r + i%3)
			}
			xs[r] = tensor.New(tensor.WithShape(elems), tensor.WithBacking(d))
			return pgs[r].AllReduce(ctx, xs[r], Sum).Wait(ctx)
		})
		for r, err := range errs {
			if err != nil {
				t.Fatalf("round %d rank %d: %v", round, r, err)
			}
		}
		for r, x := range xs {
			for i, v := range x.Float32s() {
				if want := float32(3 + 3*(i%3)); v != want {
					t.Fatalf("round %d rank %d element %d = %v, want %v", round, r, i, v, want)
				}
			}
		}
	}
	for r, pg := range pgs {
		pg.stageMu.Lock()
		st, off := pg.stage, pg.stageOff
		pg.stageMu.Unlock()
		if st != nil || !off {
			t.Errorf("rank %d: staging segment %v, off %v; want none, off", r, st != nil, off)
		}
	}
}
