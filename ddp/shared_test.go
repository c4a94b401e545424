package ddp_test

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/tandemml/tandem/comm"
	"github.com/tandemml/tandem/comm/commtest"
	"github.com/tandemml/tandem/comm/local"
	"github.com/tandemml/tandem/ddp"
	"github.com/tandemml/tandem/internal/testkit"
)

// TestSharedBuckets: DDP with its buckets in shared memory trains exactly
// as with ordinary buckets (the same parameters after steps that rebuild
// the buckets), while its gradients never go through the transport.
func TestSharedBuckets(t *testing.T) {
	const world, steps = 2, 4
	ctx := testCtx(t, 60*time.Second)
	params := make([][][]float64, 2) // [shared?][rank] -> flat parameters
	sent := make([]int64, 2)
	modelBytes := 0
	for run, shared := range []bool{false, true} {
		var count atomic.Int64
		// Ring threshold 0: every bucket takes the bandwidth path, the one
		// shared buckets replace.
		pgs := commtest.Groups(t, commtest.Counting(local.Backend{}, &count), world, comm.WithRingThreshold(0), comm.WithTimeout(30*time.Second), comm.WithStaging(false))
		params[run] = make([][]float64, world)
		testkit.RequireEachRank(t, world, func(r int) error {
			m := newMLP(t, []int{12, 40, 40, 5}, 3)
			net, err := ddp.New(ctx, pgs[r], m, ddp.BucketCapMB(4096.0/(1<<20)), ddp.Workers(1), ddp.SharedBuckets(shared))
			if err != nil {
				return err
			}
			x, y := batch(uint64(r), 6, 12, 5)
			for s := 0; s < steps; s++ {
				if s == 1 {
					count.Store(0) // after New's broadcasts and the first step
				}
				if _, err := net.Step(ctx, x, y); err != nil {
					return err
				}
			}
			if !net.Stats().Rebuilt {
				t.Errorf("rank %d: buckets not rebuilt", r)
			}
			var flat []float64
			for _, p := range m.Params() {
				flat = append(flat, p.Value.Float64s()...)
			}
			params[run][r] = flat
			if r == 0 {
				modelBytes = 8 * len(flat)
			}
			return nil
		})
		sent[run] = count.Load()
	}
	for r := 0; r < world; r++ {
		for i, v := range params[0][r] {
			if params[1][r][i] != v {
				t.Fatalf("rank %d parameter element %d: %v with shared buckets, %v without", r, i, params[1][r][i], v)
			}
		}
	}
	t.Logf("bytes sent in %d steps: %d with ordinary buckets, %d with shared ones (model %d bytes)", steps-1, sent[0], sent[1], modelBytes)
	if sent[0] < int64((steps-1)*modelBytes) {
		t.Fatalf("ordinary buckets sent only %d bytes in %d steps of a %d-byte model: the test does not measure the all-reduces", sent[0], steps-1, modelBytes)
	}
	if sent[1] > sent[0]/4 {
		t.Errorf("shared buckets sent %d bytes, ordinary ones %d: the gradients went through the transport", sent[1], sent[0])
	}
}

// TestGraphSharedBuckets: DDP over a gorgonia graph with its buckets in
// shared memory equals one process on the whole batch (to 1e-12). With a
// ring threshold of 0 every bucket's all-reduce takes the in-place shared
// path (TestSharedBuckets and comm's tests count the bytes that prove it;
// this model's buckets, 80 and 160 bytes, are too small to tell them from
// the fingerprints).
func TestGraphSharedBuckets(t *testing.T) {
	pgs := commtest.Groups(t, commtest.Counting(local.Backend{}, new(atomic.Int64)), 2, comm.WithRingThreshold(0), comm.WithTimeout(30*time.Second))
	_, _, st := runParityOn(t, pgs, parityCase{name: "plain graph, shared buckets", build: plainNet, opts: []ddp.Option{ddp.SharedBuckets(true)}})
	if st.BucketsReduced == 0 {
		t.Fatalf("stats %+v: no bucket reduced", st)
	}
}
