package checkpoint

import (
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"testing"

	G "gorgonia.org/gorgonia"
	"gorgonia.org/tensor"

	"github.com/tandemml/tandem/models"
)

// fixtureDir is the ddp_mlp fixture: testdata/ddp_mlp, or
// $TANDEM_FIXTURES/ddp_mlp when TANDEM_FIXTURES names another set.
func fixtureDir() string {
	if d := os.Getenv("TANDEM_FIXTURES"); d != "" {
		return filepath.Join(d, "ddp_mlp")
	}
	return filepath.Join("testdata", "ddp_mlp")
}

type manifest struct {
	Batch int `json:"batch"`
	Model struct {
		Kind       string `json:"kind"`
		Sizes      []int  `json:"sizes"`
		Activation string `json:"activation"`
		Bias       bool   `json:"bias"`
	} `json:"model"`
	Init   string      `json:"init"`
	Data   string      `json:"data"`
	Losses [][]float64 `json:"losses"`
}

func readManifest(t *testing.T) manifest {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(fixtureDir(), "manifest.json"))
	if err != nil {
		t.Fatal(err)
	}
	var m manifest
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	if m.Model.Kind != "mlp" || len(m.Model.Sizes) < 2 {
		t.Fatalf("manifest model %+v is not an MLP", m.Model)
	}
	return m
}

// handForward computes the MLP by plain loops from the raw file tensors.
func handForward(t *testing.T, f *File, man manifest, x []float64, n int) []float64 {
	t.Helper()
	sizes := man.Model.Sizes
	h := x
	for l := 0; l+1 < len(sizes); l++ {
		in, out := sizes[l], sizes[l+1]
		w, ok := f.Get(nameOf(2*l, "weight"))
		if !ok {
			t.Fatalf("file lacks %s", nameOf(2*l, "weight"))
		}
		wd := w.Float64s()
		var bd []float64
		if man.Model.Bias {
			bt, _ := f.Get(nameOf(2*l, "bias"))
			bd = bt.Float64s()
		}
		next := make([]float64, n*out)
		for i := 0; i < n; i++ {
			for o := 0; o < out; o++ {
				s := 0.0
				if bd != nil {
					s = bd[o]
				}
				for k := 0; k < in; k++ {
					s += h[i*in+k] * wd[o*in+k]
				}
				if l+2 < len(sizes) {
					switch man.Model.Activation {
					case "relu":
						s = math.Max(s, 0)
					case "tanh":
						s = math.Tanh(s)
					default:
						t.Fatalf("activation %q", man.Model.Activation)
					}
				}
				next[i*out+o] = s
			}
		}
		h = next
	}
	return h
}

func nameOf(i int, what string) string {
	return strconv.Itoa(i) + "." + what
}

func TestLoadPyTorchMLPAndForward(t *testing.T) {
	man := readManifest(t)
	path := filepath.Join(fixtureDir(), man.Init)
	f, err := Load(path)
	if err != nil {
		t.Fatal(err)
	}
	m, err := models.NewMLP(man.Model.Sizes, models.WithActivation(models.Activation(man.Model.Activation)), models.WithBias(man.Model.Bias), models.WithDtype(tensor.Float64))
	if err != nil {
		t.Fatal(err)
	}
	if err := LoadInto(m, path); err != nil {
		t.Fatal(err)
	}
	for _, p := range models.StateDict(m) {
		src, _ := f.Get(p.Name)
		for i, v := range src.Float64s() {
			if p.Value.Float64s()[i] != v {
				t.Fatalf("%s[%d] = %v after load, file has %v", p.Name, i, p.Value.Float64s()[i], v)
			}
		}
	}

	data, err := Load(filepath.Join(fixtureDir(), man.Data))
	if err != nil {
		t.Fatal(err)
	}
	xt, ok := data.Get("rank0.step0.x")
	if !ok {
		t.Fatal("data file lacks rank0.step0.x")
	}
	yt, _ := data.Get("rank0.step0.y")
	n := xt.Shape()[0]

	b := models.NewBuilder(nil)
	logits, err := m.Forward(b, b.Bind("x", xt))
	if err != nil {
		t.Fatal(err)
	}
	loss, err := models.CrossEntropy(logits, b.Bind("y", yt))
	if err != nil {
		t.Fatal(err)
	}
	vm := G.NewTapeMachine(b.Graph())
	defer vm.Close()
	if err := vm.RunAll(); err != nil {
		t.Fatal(err)
	}
	got := logits.Value().(*tensor.Dense).Float64s()
	want := handForward(t, f, man, xt.Float64s(), n)
	for i := range want {
		if math.Abs(got[i]-want[i]) > 1e-12 {
			t.Fatalf("logit %d: model %v, by hand %v", i, got[i], want[i])
		}
	}
	// Rank 0's first loss in the PyTorch run used exactly these weights.
	lv := loss.Value().Data().(float64)
	if math.Abs(lv-man.Losses[0][0]) > 1e-12 {
		t.Errorf("loss %v, PyTorch %v", lv, man.Losses[0][0])
	}
}
