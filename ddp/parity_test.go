package ddp_test

import (
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"testing"
	"time"

	"gorgonia.org/tensor"

	"github.com/tandemml/tandem/checkpoint"
	"github.com/tandemml/tandem/internal/testkit"

	"github.com/tandemml/tandem/ddp"
	"github.com/tandemml/tandem/models"
	"github.com/tandemml/tandem/optim"
)

// ddpManifest is the manifest.json of a ddp_mlp fixture set.
type ddpManifest struct {
	World       int     `json:"world"`
	Batch       int     `json:"batch"`
	Steps       int     `json:"steps"`
	BucketCapMB float64 `json:"bucket_cap_mb"`
	Model       struct {
		Kind       string `json:"kind"`
		Sizes      []int  `json:"sizes"`
		Activation string `json:"activation"`
		Bias       bool   `json:"bias"`
	} `json:"model"`
	Optimizer map[string]any `json:"optimizer"`
	Init      string         `json:"init"`
	Data      string         `json:"data"`
	Final     string         `json:"final"`
	Losses    [][]float64    `json:"losses"`
}

// fixtureDir is ddp/testdata/ddp_mlp, or $TANDEM_FIXTURES/ddp_mlp when set.
func fixtureDir() string {
	if root := os.Getenv("TANDEM_FIXTURES"); root != "" {
		return filepath.Join(root, "ddp_mlp")
	}
	return filepath.Join("testdata", "ddp_mlp")
}

func loadManifest(t *testing.T, dir string) ddpManifest {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(dir, "manifest.json"))
	if err != nil {
		t.Fatal(err)
	}
	var m ddpManifest
	if err := json.Unmarshal(raw, &m); err != nil {
		t.Fatalf("manifest: %v", err)
	}
	if m.Model.Kind != "mlp" {
		t.Fatalf("manifest: model kind %q; this test trains an mlp", m.Model.Kind)
	}
	if len(m.Losses) != m.World {
		t.Fatalf("manifest: %d loss rows for world %d", len(m.Losses), m.World)
	}
	for field, def := range map[string]string{"init": "init.safetensors", "data": "data.safetensors", "final": "final.safetensors"} {
		p := map[string]*string{"init": &m.Init, "data": &m.Data, "final": &m.Final}[field]
		if *p == "" {
			*p = def
		}
	}
	return m
}

// TestParityWithPyTorch trains the fixture's MLP with DDP on every rank and
// compares each rank's loss at each step, and the final weights, with
// PyTorch's DistributedDataParallel (gloo, float64), over both backends.
func TestParityWithPyTorch(t *testing.T) {
	dir := fixtureDir()
	m := loadManifest(t, dir)
	data, err := checkpoint.Load(filepath.Join(dir, m.Data))
	if err != nil {
		t.Fatal(err)
	}
	final, err := checkpoint.Load(filepath.Join(dir, m.Final))
	if err != nil {
		t.Fatal(err)
	}
	optName, _ := m.Optimizer["kind"].(string)
	settings := map[string]any{}
	for k, v := range m.Optimizer {
		if k != "kind" {
			settings[k] = v
		}
	}
	const tol = 1e-9
	for _, be := range backends {
		t.Run(be.name, func(t *testing.T) {
			testkit.CheckLeaks(t) // after the groups are closed
			pgs := be.make(t, m.World)
			ctx := testCtx(t, 60*time.Second)
			nets := make([]*ddp.DDP, m.World)
			testkit.RequireEachRank(t, m.World, func(r int) error {
				model, err := models.NewMLP(m.Model.Sizes, models.WithActivation(models.Activation(m.Model.Activation)), models.WithBias(m.Model.Bias), models.WithDtype(tensor.Float64))
				if err != nil {
					return err
				}
				if r == 0 {
					if err := checkpoint.LoadInto(model, filepath.Join(dir, m.Init)); err != nil {
						return err
					}
				} else {
					// other random weights, which the broadcast must overwrite
					for _, p := range model.Params() {
						for i := range p.Value.Float64s() {
							p.Value.Float64s()[i] = float64(r*1000 + i)
						}
					}
				}
				net, err := ddp.New(ctx, pgs[r], model, ddp.BucketCapMB(m.BucketCapMB))
				if err != nil {
					return err
				}
				nets[r] = net
				opt, err := optim.New(optName, net.Parameters(), settings)
				if err != nil {
					return err
				}
				worstLoss := 0.0
				for s := 0; s < m.Steps; s++ {
					x, ok1 := data.Get(fmt.Sprintf("rank%d.step%d.x", r, s))
					y, ok2 := data.Get(fmt.Sprintf("rank%d.step%d.y", r, s))
					if !ok1 || !ok2 {
						return fmt.Errorf("data for rank %d step %d missing", r, s)
					}
					if x.Shape()[0] != m.Batch || y.Shape()[0] != m.Batch {
						return fmt.Errorf("rank %d step %d: batch of %d rows, the manifest says %d", r, s, x.Shape()[0], m.Batch)
					}
					loss, err := net.Step(ctx, x, y)
					if err != nil {
						return fmt.Errorf("step %d: %w", s, err)
					}
					if want := m.Losses[r][s]; !relClose(loss, want, tol) {
						return fmt.Errorf("step %d: loss %.17g, PyTorch %.17g (diff %.3g)", s, loss, want, loss-want)
					}
					worstLoss = math.Max(worstLoss, maxRelDiff([]float64{loss}, []float64{m.Losses[r][s]}))
					if err := opt.Step(); err != nil {
						return err
					}
				}
				worst := 0.0
				for _, p := range models.StateDict(model) {
					want, ok := final.Get(p.Name)
					if !ok {
						return fmt.Errorf("final state lacks %s", p.Name)
					}
					got := p.Value.Float64s()
					w := want.Float64s()
					for i := range got {
						if !relClose(got[i], w[i], tol) {
							return fmt.Errorf("final %s[%d] = %.17g, PyTorch %.17g", p.Name, i, got[i], w[i])
						}
					}
					worst = math.Max(worst, maxRelDiff(got, w))
				}
				if r == 0 {
					t.Logf("%s: world %d, %d steps, %d buckets %v; worst relative difference of rank 0's losses %.3g, of the final weights %.3g",
						be.name, m.World, m.Steps, len(net.Buckets()), bucketSizes(net.Buckets()), worstLoss, worst)
				}
				return nil
			})
			st := nets[0].Stats()
			if st.Steps != int64(m.Steps) || st.BucketsReduced == 0 {
				t.Errorf("stats: %+v", st)
			}
			// Every parameter of the MLP has a Linear gradient op, which
			// computes straight into the bucket.
			if want := int64(m.Steps * len(models.StateDict(nets[0].Module()))); st.GradsInBucket != want || st.GradsCopied != 0 {
				t.Errorf("gradients computed in the buckets %d, copied %d; want %d and 0", st.GradsInBucket, st.GradsCopied, want)
			}
		})
	}
}

func bucketSizes(bs []ddp.BucketInfo) []int64 {
	out := make([]int64, len(bs))
	for i, b := range bs {
		out[i] = b.Bytes
	}
	return out
}
