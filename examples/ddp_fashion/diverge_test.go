package main

import (
	"errors"
	"math"
	"strings"
	"testing"

	"gorgonia.org/tensor"

	"github.com/tandemml/tandem/models"
)

// withGrads gives every parameter of the example's model a finite gradient.
func withGrads(t testing.TB) *models.Sequential {
	t.Helper()
	m, err := newModel(1)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range m.Params() {
		g := p.Value.Clone().(*tensor.Dense)
		p.Grad = g
	}
	return m
}

func TestGradsFinite(t *testing.T) {
	m := withGrads(t)
	ps := m.Params()
	if !gradsFinite(ps) {
		t.Fatal("finite gradients reported non-finite")
	}
	for _, v := range []float64{math.NaN(), math.Inf(1), math.Inf(-1)} {
		last := ps[len(ps)-1].Grad.Float32s()
		old := last[len(last)-1]
		last[len(last)-1] = float32(v)
		if gradsFinite(ps) {
			t.Errorf("a %v in the last gradient went unnoticed", v)
		}
		last[len(last)-1] = old
	}
	ps[0].Grad = nil // a parameter without a gradient is skipped
	if !gradsFinite(ps) {
		t.Error("a missing gradient counted as non-finite")
	}
}

// TestDivergedMessages checks the wording of the per-epoch cases, which
// the training tests reach less easily than the per-step one.
func TestDivergedMessages(t *testing.T) {
	err := diverged("epoch 4/5", "the mean training loss is NaN", []lossAt{{0, 0}, {7, math.Inf(1)}}, false, "out", "out/checkpoint-epoch003.safetensors")
	var d *divergedError
	if !errors.As(err, &d) || exitCode(err) != exitDiverged {
		t.Fatalf("%v is not a divergence", err)
	}
	want := "training diverged at epoch 4/5: the mean training loss is NaN; the first non-finite loss: rank 1 +Inf at step 7; " +
		"stopped without saving: the last good checkpoint is out/checkpoint-epoch003.safetensors, which -resume continues from"
	if err.Error() != want {
		t.Errorf("got  %s\nwant %s", err, want)
	}
	err = diverged("epoch 1/5", "the test loss is NaN", nil, false, "", "")
	if err.Error() != "training diverged at epoch 1/5: the test loss is NaN; stopped" {
		t.Errorf("without -out: %s", err)
	}
	if s := diverged("epoch 1/5, step 2", "x", []lossAt{{2, 2.25}}, true, "out", "").Error(); !strings.Contains(s, "rank 0 2.25; stopped before any checkpoint was written") {
		t.Errorf("first epoch: %s", s)
	}
}

// BenchmarkGradsFinite measures the per-step check on the example's model
// (215,370 float32 gradients).
func BenchmarkGradsFinite(b *testing.B) {
	ps := withGrads(b).Params()
	for b.Loop() {
		if !gradsFinite(ps) {
			b.Fatal("not finite")
		}
	}
}
