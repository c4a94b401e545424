package main

import (
	"encoding/json"
	"errors"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"gorgonia.org/tensor"

	"github.com/tandemml/tandem/checkpoint"
	"github.com/tandemml/tandem/models"
	"github.com/tandemml/tandem/optim"
)

func TestListCheckpoints(t *testing.T) {
	dir := t.TempDir()
	if _, err := listCheckpoints(filepath.Join(dir, "missing")); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("missing folder: %v, want fs.ErrNotExist", err)
	}
	if got, err := listCheckpoints(dir); err != nil || len(got) != 0 {
		t.Fatalf("empty folder: %q, %v", got, err)
	}
	for _, name := range []string{"checkpoint-epoch002.safetensors", "checkpoint-epoch010.safetensors",
		"checkpoint-epoch009.safetensors", "checkpoint-epoch011.safetensors.tmp", "curves.png"} {
		if err := os.WriteFile(filepath.Join(dir, name), nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	got, err := listCheckpoints(dir)
	want := []string{checkpointPath(dir, 10), checkpointPath(dir, 9), checkpointPath(dir, 2)}
	if err != nil || !slices.Equal(got, want) {
		t.Fatalf("got %q, %v; want %q", got, err, want)
	}
	if n, err := removeCheckpoints(dir); n != 3 || err != nil {
		t.Fatalf("removeCheckpoints: %d, %v; want 3 files removed", n, err)
	}
	left, _ := os.ReadDir(dir)
	if len(left) != 2 {
		t.Errorf("%d files left, want the plot and the stray .tmp", len(left))
	}
}

// stepOnce gives every parameter a gradient and takes one optimizer step,
// so that the optimizer has state to save.
func stepOnce(t *testing.T, m models.Module, opt optim.Optimizer) {
	t.Helper()
	for _, p := range m.Params() {
		g := p.Value.Clone().(*tensor.Dense)
		for i, v := range g.Float32s() {
			g.Float32s()[i] = 0.1*v + 0.01
		}
		p.Grad = g
	}
	if err := opt.Step(); err != nil {
		t.Fatal(err)
	}
}

func TestCheckpointRoundTrip(t *testing.T) {
	for _, name := range []string{"sgd", "adam"} {
		t.Run(name, func(t *testing.T) {
			cfg := config{Optimizer: name, LR: 0.01, Schedule: "cosine", Epochs: 4}
			m, err := newModel(5)
			if err != nil {
				t.Fatal(err)
			}
			opt, err := newOptimizer(cfg, m.Params())
			if err != nil {
				t.Fatal(err)
			}
			sched, err := newScheduler(cfg, opt)
			if err != nil {
				t.Fatal(err)
			}
			stepOnce(t, m, opt)
			sched.Step()
			hist := []epochStats{{Epoch: 1, TrainLoss: 0.5, TestLoss: 0.4, TestAcc: 0.8, LR: 0.01, Seconds: 3}}
			path := checkpointPath(t.TempDir(), 1)
			if err := saveCheckpoint(path, m, opt, sched, 1, hist, runSettings{Seed: 5, WorldSize: 2, Batch: 64, Optimizer: name}); err != nil {
				t.Fatal(err)
			}

			// A fresh model, optimizer and schedule from another seed take the state.
			m2, _ := newModel(6)
			opt2, _ := newOptimizer(cfg, m2.Params())
			sched2, _ := newScheduler(cfg, opt2)
			f, err := checkpoint.Load(path)
			if err != nil {
				t.Fatal(err)
			}
			r, err := restore(f, m2, opt2, sched2)
			if err != nil {
				t.Fatal(err)
			}
			if sched2.State() != sched.State() || opt2.LR() != opt.LR() || opt.LR() >= 0.01 {
				t.Errorf("schedule %+v lr %v restored as %+v lr %v", sched.State(), opt.LR(), sched2.State(), opt2.LR())
			}
			if r.Epoch != 1 || len(r.History) != 1 || r.History[0] != hist[0] || r.Settings["world_size"] != "2" {
				t.Errorf("restored %+v", r)
			}
			sameState(t, "model", stateOf(m), stateOf(m2))
			st1, st2 := opt.State(), opt2.State()
			if len(st1) != len(st2) || len(st1) == 0 {
				t.Fatalf("optimizer state has %d entries, restored %d", len(st1), len(st2))
			}
			for k, v := range st1 {
				if !equalDense(v, st2[k]) {
					t.Errorf("optimizer state %s differs after the round trip", k)
				}
			}
			// The same next epoch from both.
			stepOnce(t, m, opt)
			stepOnce(t, m2, opt2)
			sched.Step()
			sched2.Step()
			if opt2.LR() != opt.LR() {
				t.Errorf("next learning rate %v, restored run %v", opt.LR(), opt2.LR())
			}
			sameState(t, "after one more step", stateOf(m), stateOf(m2))
		})
	}
}

func equalDense(a, b *tensor.Dense) bool {
	if a == nil || b == nil || !a.Shape().Eq(b.Shape()) || a.Dtype() != b.Dtype() {
		return false
	}
	return string(denseBytes(a)) == string(denseBytes(b))
}

func TestRestoreRefusesForeignCheckpoints(t *testing.T) {
	m, _ := newModel(1)
	opt, _ := newOptimizer(config{Optimizer: "sgd", LR: 0.1}, m.Params())
	stepOnce(t, m, opt)
	dir := t.TempDir()

	// A checkpoint of another model: entries missing.
	mlp, err := models.NewMLP([]int{784, 10}, models.WithDtype(tensor.Float32))
	if err != nil {
		t.Fatal(err)
	}
	other := filepath.Join(dir, "other.safetensors")
	if err := checkpoint.SaveModule(other, mlp, map[string]string{"epoch": "1"}); err != nil {
		t.Fatal(err)
	}
	f, err := checkpoint.Load(other)
	if err != nil {
		t.Fatal(err)
	}
	before := stateOf(m)
	last := models.StateDict(m)[len(models.StateDict(m))-1].Name // the CNN's last entry, absent from the MLP
	if _, err := restore(f, m, opt, nil); !errors.Is(err, checkpoint.ErrMismatch) || !strings.Contains(err.Error(), last) {
		t.Errorf("foreign model: %v, want ErrMismatch naming %s", err, last)
	}
	sameState(t, "model after a refused checkpoint", before, stateOf(m))

	// A model of the same names but other shapes: refused, nothing changed.
	wide, err := models.NewCNN(models.CNNConfig{Hidden: 64}, nil, models.WithDtype(tensor.Float32))
	if err != nil {
		t.Fatal(err)
	}
	wideOpt, _ := newOptimizer(config{Optimizer: "sgd", LR: 0.1}, wide.Params())
	stepOnce(t, wide, wideOpt)
	widePath := filepath.Join(dir, "wide.safetensors")
	if err := saveCheckpoint(widePath, wide, wideOpt, nil, 1, nil, runSettings{Optimizer: "sgd"}); err != nil {
		t.Fatal(err)
	}
	f, _ = checkpoint.Load(widePath)
	optBefore := opt.State()
	if _, err := restore(f, m, opt, nil); !errors.Is(err, checkpoint.ErrMismatch) {
		t.Errorf("other shapes: %v, want ErrMismatch", err)
	}
	sameState(t, "model after a refused checkpoint", before, stateOf(m))
	for k, v := range opt.State() {
		if !equalDense(v, optBefore[k]) {
			t.Errorf("optimizer state %s changed by a refused checkpoint", k)
		}
	}

	// No epoch in the metadata.
	good := checkpointPath(dir, 1)
	sched, _ := newScheduler(config{Schedule: "cosine", Epochs: 3}, opt)
	if err := saveCheckpoint(good, m, opt, sched, 1, nil, runSettings{Optimizer: "sgd"}); err != nil {
		t.Fatal(err)
	}
	f, _ = checkpoint.Load(good)
	delete(f.Metadata, "epoch")
	if _, err := restore(f, m, opt, sched); !errors.Is(err, checkpoint.ErrFormat) {
		t.Errorf("no epoch: %v, want ErrFormat", err)
	}

	// A broken scheduler state changes nothing.
	f, _ = checkpoint.Load(good)
	f.Metadata["scheduler"] = `{"LastEpoch":-4,"StepCount":0}`
	lr := opt.LR()
	if _, err := restore(f, m, opt, sched); !errors.Is(err, checkpoint.ErrFormat) || opt.LR() != lr {
		t.Errorf("bad scheduler state: %v (lr %v, was %v)", err, opt.LR(), lr)
	}

	// An SGD checkpoint into Adam: the optimizer state does not fit.
	f, _ = checkpoint.Load(good)
	adam, _ := newOptimizer(config{Optimizer: "adam", LR: 0.1}, m.Params())
	if _, err := restore(f, m, adam, nil); err == nil || !strings.Contains(err.Error(), "optimizer state") {
		t.Errorf("sgd state into adam: %v", err)
	}
}

func TestScoreBatch(t *testing.T) {
	logits := tensor.New(tensor.WithShape(3, 3), tensor.WithBacking([]float32{
		2, 0, 0, // predicts 0
		0, 0, 1, // predicts 2
		1, 1, 1, // a tie: predicts the first, 0
	}))
	correct, loss, err := scoreBatch(logits, []int64{0, 1, 0})
	if err != nil {
		t.Fatal(err)
	}
	if correct != 2 {
		t.Errorf("correct = %v, want 2", correct)
	}
	want := -math.Log(math.Exp(2)/(math.Exp(2)+2)) - math.Log(1/(2+math.E)) + math.Log(3)
	if math.Abs(loss-want) > 1e-6 {
		t.Errorf("loss = %v, want %v", loss, want)
	}
	if _, _, err := scoreBatch(logits, []int64{0, 1, 5}); err == nil {
		t.Error("label out of range accepted")
	}
	if _, _, err := scoreBatch(logits, []int64{0, 1}); err == nil {
		t.Error("label count mismatch accepted")
	}
}

// TestHistoryJSONNonFinite checks that statistics holding NaN or
// infinities encode (as strings) and decode back, inside a checkpoint too,
// where encoding/json alone fails with "unsupported value: NaN".
func TestHistoryJSONNonFinite(t *testing.T) {
	hist := []epochStats{
		{Epoch: 1, TrainLoss: 0.5, TestLoss: 0.25, TestAcc: 0.9, LR: 0.05, Seconds: 2},
		{Epoch: 2, TrainLoss: math.NaN(), TestLoss: math.Inf(1), TestAcc: 0.1, LR: math.Inf(-1), Seconds: 3},
	}
	b, err := json.Marshal(hist)
	if err != nil {
		t.Fatal(err)
	}
	want := `[{"epoch":1,"train_loss":0.5,"test_loss":0.25,"test_acc":0.9,"lr":0.05,"seconds":2},` +
		`{"epoch":2,"train_loss":"NaN","test_loss":"Inf","test_acc":0.1,"lr":"-Inf","seconds":3}]`
	if string(b) != want {
		t.Errorf("JSON %s\nwant %s", b, want)
	}
	var back []epochStats
	if err := json.Unmarshal(b, &back); err != nil {
		t.Fatal(err)
	}
	if len(back) != 2 || back[0] != hist[0] || !math.IsNaN(back[1].TrainLoss) || !math.IsInf(back[1].TestLoss, 1) || !math.IsInf(back[1].LR, -1) || back[1].TestAcc != 0.1 {
		t.Errorf("decoded %+v", back)
	}
	if err := json.Unmarshal([]byte(`[{"epoch":1,"train_loss":"lots"}]`), &back); err == nil {
		t.Error(`"lots" decoded as a loss`)
	}

	// A checkpoint whose history holds them saves and restores.
	cfg := config{Optimizer: "sgd", LR: 0.01}
	m, _ := newModel(2)
	opt, _ := newOptimizer(cfg, m.Params())
	path := checkpointPath(t.TempDir(), 2)
	if err := saveCheckpoint(path, m, opt, nil, 2, hist, runSettings{Optimizer: "sgd"}); err != nil {
		t.Fatal(err)
	}
	f, err := checkpoint.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	r, err := restore(f, m, opt, nil)
	if err != nil || len(r.History) != 2 || !math.IsNaN(r.History[1].TrainLoss) {
		t.Errorf("restored %+v, %v", r.History, err)
	}

	// Weights holding a NaN are not saved.
	m.Params()[0].Value.Float32s()[3] = float32(math.NaN())
	if err := saveCheckpoint(path+"2", m, opt, nil, 3, hist, runSettings{}); !errors.Is(err, checkpoint.ErrNonFinite) || !strings.Contains(err.Error(), m.Params()[0].Name) {
		t.Errorf("saving NaN weights: %v, want ErrNonFinite naming %s", err, m.Params()[0].Name)
	}
	if _, err := os.Stat(path + "2"); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("a file was written for NaN weights (%v)", err)
	}
}
