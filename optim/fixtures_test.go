package optim

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"testing"

	"github.com/tandemml/tandem/models"
	"gorgonia.org/tensor"
)

// The golden files hold torch.optim 1.13's parameters after every step of
// short runs in float64 (format described in /work/shared/fixtures/README.md,
// "optim/cases.json"). testdata/cases.json is a copy; TANDEM_FIXTURES, when
// set, names a folder laid out like the shared fixtures whose
// optim/cases.json is run as well (in addition to the bundled copy).

type fxTensor struct {
	Shape []int     `json:"shape"`
	Data  []float64 `json:"data"`
}

type fxCase struct {
	Name        string         `json:"name"`
	Optimizer   string         `json:"optimizer"`
	Settings    map[string]any `json:"settings"`
	Shapes      [][]int        `json:"shapes"`
	Steps       int            `json:"steps"`
	Init        []*fxTensor    `json:"init"`
	Grads       [][]*fxTensor  `json:"grads"`
	ParamsAfter [][]*fxTensor  `json:"params_after"`
}

type fxFile struct {
	Format     int      `json:"format"`
	ProducedBy string   `json:"produced_by"`
	Cases      []fxCase `json:"cases"`
}

func loadFixtures(t *testing.T, path string) fxFile {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("reading fixtures: %v", err)
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	var f fxFile
	if err := dec.Decode(&f); err != nil {
		t.Fatalf("%s: %v (a field this test does not know fails it: update the test with the format)", path, err)
	}
	if f.Format != 1 {
		t.Fatalf("%s: format %d, this test reads format 1", path, f.Format)
	}
	if len(f.Cases) == 0 {
		t.Fatalf("%s: no cases", path)
	}
	return f
}

func prod(shape []int) int {
	n := 1
	for _, d := range shape {
		n *= d
	}
	return n
}

// checkCase verifies that a case is self-consistent before running it.
func checkCase(c fxCase) error {
	if c.Steps <= 0 || len(c.Grads) != c.Steps || len(c.ParamsAfter) != c.Steps {
		return fmt.Errorf("steps %d but %d grads and %d params_after", c.Steps, len(c.Grads), len(c.ParamsAfter))
	}
	if len(c.Init) != len(c.Shapes) {
		return fmt.Errorf("%d shapes but %d init tensors", len(c.Shapes), len(c.Init))
	}
	check := func(what string, x *fxTensor, shape []int, nilOK bool) error {
		if x == nil {
			if nilOK {
				return nil
			}
			return fmt.Errorf("%s is null", what)
		}
		if fmt.Sprint(x.Shape) != fmt.Sprint(shape) || len(x.Data) != prod(shape) {
			return fmt.Errorf("%s has shape %v and %d values, want shape %v", what, x.Shape, len(x.Data), shape)
		}
		return nil
	}
	for i, sh := range c.Shapes {
		if err := check(fmt.Sprintf("init[%d]", i), c.Init[i], sh, false); err != nil {
			return err
		}
	}
	for s := 0; s < c.Steps; s++ {
		if len(c.Grads[s]) != len(c.Shapes) || len(c.ParamsAfter[s]) != len(c.Shapes) {
			return fmt.Errorf("step %d: %d grads and %d params_after for %d parameters", s, len(c.Grads[s]), len(c.ParamsAfter[s]), len(c.Shapes))
		}
		for i, sh := range c.Shapes {
			if err := check(fmt.Sprintf("grads[%d][%d]", s, i), c.Grads[s][i], sh, true); err != nil {
				return err
			}
			if err := check(fmt.Sprintf("params_after[%d][%d]", s, i), c.ParamsAfter[s][i], sh, false); err != nil {
				return err
			}
		}
	}
	return nil
}

// denseOf builds a tensor of dtype dt holding x.
func denseOf(x *fxTensor, dt tensor.Dtype) *tensor.Dense {
	if dt == tensor.Float32 {
		d := make([]float32, len(x.Data))
		for i, v := range x.Data {
			d[i] = float32(v)
		}
		if len(x.Shape) == 0 {
			return tensor.New(tensor.FromScalar(d[0]))
		}
		return tensor.New(tensor.WithShape(x.Shape...), tensor.WithBacking(d))
	}
	d := append([]float64(nil), x.Data...)
	if len(x.Shape) == 0 {
		return tensor.New(tensor.FromScalar(d[0]))
	}
	return tensor.New(tensor.WithShape(x.Shape...), tensor.WithBacking(d))
}

func values(t *tensor.Dense) []float64 {
	if t.Dtype() == tensor.Float32 {
		out := []float64{}
		for _, v := range t.Float32s() {
			out = append(out, float64(v))
		}
		return out
	}
	return append([]float64(nil), t.Float64s()...)
}

func ulps(a, b float64) uint64 {
	x, y := int64(math.Float64bits(a)), int64(math.Float64bits(b))
	if (x < 0) != (y < 0) {
		return math.MaxUint64
	}
	if x > y {
		return uint64(x - y)
	}
	return uint64(y - x)
}

// runCase runs c with tensors of dtype dt and checks every step against the
// expected parameters within tol*max(1,|expected|). It returns the largest
// difference in ulps (float64 only).
func runCase(t *testing.T, c fxCase, dt tensor.Dtype, tol float64) uint64 {
	t.Helper()
	if err := checkCase(c); err != nil {
		t.Fatalf("malformed case: %v", err)
	}
	params := make([]*models.Param, len(c.Shapes))
	for i := range params {
		params[i] = &models.Param{Name: fmt.Sprintf("p%d", i), Value: denseOf(c.Init[i], dt), RequiresGrad: true}
	}
	opt, err := New(c.Optimizer, params, c.Settings)
	if err != nil {
		t.Fatalf("building %q with settings %v: %v", c.Optimizer, c.Settings, err)
	}
	var worst uint64
	for s := 0; s < c.Steps; s++ {
		for i, p := range params {
			if g := c.Grads[s][i]; g != nil {
				p.Grad = denseOf(g, dt)
			} else {
				p.Grad = nil
			}
		}
		if err := opt.Step(); err != nil {
			t.Fatalf("step %d: %v", s, err)
		}
		for i, p := range params {
			got := values(p.Value)
			want := c.ParamsAfter[s][i].Data
			for j := range want {
				if d := math.Abs(got[j] - want[j]); !(d <= tol*math.Max(1, math.Abs(want[j]))) {
					t.Fatalf("step %d param %d element %d: got %.17g, torch %.17g (diff %.3g)", s, i, j, got[j], want[j], d)
				}
				if u := ulps(got[j], want[j]); u > worst {
					worst = u
				}
			}
		}
	}
	return worst
}

func fixturePaths(t *testing.T) []string {
	paths := []string{filepath.Join("testdata", "cases.json")}
	if dir := os.Getenv("TANDEM_FIXTURES"); dir != "" {
		p := filepath.Join(dir, "optim", "cases.json")
		if _, err := os.Stat(p); err != nil {
			t.Fatalf("TANDEM_FIXTURES=%s but %v", dir, err)
		}
		paths = append(paths, p)
	}
	return paths
}

// TestFixtures runs every case of every golden file in float64 and checks
// every step to 1e-12 relative. For the bundled file it also requires bit
// equality: that file was made on a machine whose torch kernels fuse
// multiply-adds, which this package reproduces (see the package doc).
func TestFixtures(t *testing.T) {
	for _, path := range fixturePaths(t) {
		f := loadFixtures(t, path)
		bundled := path == filepath.Join("testdata", "cases.json")
		for _, c := range f.Cases {
			label := "bundled"
			if !bundled {
				label = "TANDEM_FIXTURES"
			}
			t.Run(label+"/"+c.Name, func(t *testing.T) {
				worst := runCase(t, c, tensor.Float64, 1e-12)
				t.Logf("%s (%s %v): largest difference from torch %d ulp", c.Name, c.Optimizer, c.Settings, worst)
				if bundled && worst != 0 {
					t.Errorf("bundled fixture: expected bit-identical results, worst case %d ulp", worst)
				}
			})
		}
	}
}

// TestFixturesFloat32 runs the same cases on float32 tensors; they must
// track the float64 trajectory to float32 accuracy.
func TestFixturesFloat32(t *testing.T) {
	for _, path := range fixturePaths(t) {
		for _, c := range loadFixtures(t, path).Cases {
			t.Run(c.Name, func(t *testing.T) { runCase(t, c, tensor.Float32, 2e-5) })
		}
	}
}
