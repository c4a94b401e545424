package ddp_test

import (
	"fmt"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tandemml/tandem/comm"
	"github.com/tandemml/tandem/comm/commtest"
	"github.com/tandemml/tandem/comm/local"
	"github.com/tandemml/tandem/ddp"
	"github.com/tandemml/tandem/internal/testkit"
	"github.com/tandemml/tandem/internal/testlog"
)

// sharedRun is one way TestSharedBuckets keeps the buckets.
type sharedRun struct {
	name string
	dir  string       // comm.WithSharedDir; "": the default
	opts []ddp.Option // beyond the test's own
	// want: how much the gradients go through the transport, against the
	// private run: "all", "none", or "some" (a mixed layout).
	want string
}

// TestSharedBuckets: DDP with its buckets in shared memory (the default on
// one host) trains exactly as with ordinary buckets (the same parameters
// after steps that rebuild the buckets), while its gradients never go
// through the transport. Where the memory cannot be had (a missing
// directory; as root also a tmpfs with room for the first buckets only)
// every rank falls back to ordinary memory for the buckets that did not
// fit, trains the same, and the group's logger says so.
func TestSharedBuckets(t *testing.T) {
	runs := []sharedRun{
		{name: "private", opts: []ddp.Option{ddp.SharedBuckets(false)}, want: "all"},
		{name: "shared by default", want: "none"},
		{name: "shared, explicit", opts: []ddp.Option{ddp.SharedBuckets(true)}, want: "none"},
		{name: "no shared directory", dir: filepath.Join(t.TempDir(), "missing"), want: "all"},
	}
	if small, ok := smallTmpfs(t, 32<<10); ok {
		runs = append(runs, sharedRun{name: "tmpfs of 32 KiB", dir: small, want: "some"})
	} else {
		t.Log("not root: the mixed layout (a tmpfs with room for some buckets) is not tried")
	}
	const world, steps = 2, 4
	ctx := testCtx(t, 60*time.Second)
	params := make([][][]float64, len(runs)) // [run][rank] -> flat parameters
	sent := make([]int64, len(runs))
	modelBytes := 0
	for run, rc := range runs {
		var count atomic.Int64
		var logged testlog.Buffer
		// Ring threshold 0: every bucket takes the bandwidth path, the one
		// shared buckets replace.
		pgs := commtest.Groups(t, commtest.Counting(local.Backend{}, &count), world, comm.WithRingThreshold(0), comm.WithTimeout(30*time.Second), comm.WithStaging(false),
			comm.WithSharedDir(rc.dir), comm.WithLogger(logged.Logger()))
		params[run] = make([][]float64, world)
		testkit.RequireEachRank(t, world, func(r int) error {
			m := newMLP(t, []int{12, 40, 40, 5}, 3)
			opts := append([]ddp.Option{ddp.BucketCapMB(4096.0 / (1 << 20)), ddp.Workers(1)}, rc.opts...)
			net, err := ddp.New(ctx, pgs[r], m, opts...)
			if err != nil {
				return fmt.Errorf("%s: %w", rc.name, err)
			}
			x, y := batch(uint64(r), 6, 12, 5)
			for s := 0; s < steps; s++ {
				if s == 1 {
					count.Store(0) // after New's broadcasts and the first step
				}
				if _, err := net.Step(ctx, x, y); err != nil {
					return fmt.Errorf("%s: step %d: %w", rc.name, s, err)
				}
			}
			if !net.Stats().Rebuilt {
				t.Errorf("%s: rank %d: buckets not rebuilt", rc.name, r)
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
		warned := strings.Count(logged.String(), "gradient buckets in private memory")
		if fallback := rc.want != "none" && rc.dir != ""; fallback != (warned > 0) {
			t.Errorf("%s: %d warnings of private buckets logged:\n%s", rc.name, warned, logged.String())
		}
	}
	for run := 1; run < len(runs); run++ {
		for r := 0; r < world; r++ {
			for i, v := range params[0][r] {
				if params[run][r][i] != v {
					t.Fatalf("rank %d parameter element %d: %v %s, %v with private buckets", r, i, params[run][r][i], runs[run].name, v)
				}
			}
		}
	}
	if sent[0] < int64((steps-1)*modelBytes) {
		t.Fatalf("ordinary buckets sent only %d bytes in %d steps of a %d-byte model: the test does not measure the all-reduces", sent[0], steps-1, modelBytes)
	}
	none := sent[1] // shared by default
	for run, rc := range runs {
		t.Logf("%s: %d bytes sent in %d steps (model %d bytes)", rc.name, sent[run], steps-1, modelBytes)
		var ok bool
		switch rc.want {
		case "all":
			ok = sent[run] >= sent[0]*9/10
		case "none":
			ok = sent[run] <= sent[0]/4
		case "some":
			ok = sent[run] > 2*none && sent[run] < sent[0]*9/10
		}
		if !ok {
			t.Errorf("%s: %d bytes sent against %d with private buckets; want the gradients to go through the transport: %s", rc.name, sent[run], sent[0], rc.want)
		}
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
