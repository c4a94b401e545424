package main

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"image/png"
	"io"
	"io/fs"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"gorgonia.org/tensor"

	"github.com/tandemml/tandem/checkpoint"
	"github.com/tandemml/tandem/comm/local"
	"github.com/tandemml/tandem/data"
	"github.com/tandemml/tandem/models"
)

// writeIDX writes an IDX file of unsigned bytes with the given magic and
// dimensions.
func writeIDX(t *testing.T, path string, magic uint32, dims []int, payload []byte) {
	t.Helper()
	var b bytes.Buffer
	binary.Write(&b, binary.BigEndian, magic)
	for _, d := range dims {
		binary.Write(&b, binary.BigEndian, uint32(d))
	}
	b.Write(payload)
	if err := os.WriteFile(path, b.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
}

// writeSynthetic writes a tiny Fashion-MNIST look-alike into dir: 28×28
// images of noise with a bright 6×6 square whose position (one of a 4×4
// grid... of which the first ten places are used) is the class, so that a
// small CNN separates the classes within a few steps.
func writeSynthetic(t *testing.T, dir string, nTrain, nTest int) {
	t.Helper()
	rng := rand.New(rand.NewPCG(7, 7))
	split := func(images, labels string, n int) {
		px := make([]byte, n*28*28)
		lab := make([]byte, n)
		for i := range n {
			c := i % 10
			lab[i] = byte(c)
			img := px[i*784 : (i+1)*784]
			for j := range img {
				img[j] = byte(rng.IntN(60))
			}
			r0, c0 := 2+(c/4)*7, 2+(c%4)*7
			for r := r0; r < r0+6; r++ {
				for col := c0; col < c0+6; col++ {
					img[r*28+col] = byte(200 + rng.IntN(56))
				}
			}
		}
		writeIDX(t, filepath.Join(dir, images), data.ImagesMagic, []int{n, 28, 28}, px)
		writeIDX(t, filepath.Join(dir, labels), data.LabelsMagic, []int{n}, lab)
	}
	split("train-images-idx3-ubyte", "train-labels-idx1-ubyte", nTrain)
	split("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte", nTest)
}

// testConfig is a quick configuration for the synthetic data.
func testConfig(out string, epochs int) config {
	return config{Epochs: epochs, Batch: 16, LR: 0.02, Optimizer: "sgd", Schedule: "cosine", Out: out, Seed: 3,
		EvalBatch: 40, Progress: progressLines, ProgressEvery: 50}
}

// rankResult is what one goroutine rank of runRanks returns.
type rankResult struct {
	hist  []epochStats
	model *models.Sequential
	out   string
	err   error
}

// runRanks trains with n goroutine ranks over comm/local groups.
func runRanks(t *testing.T, n int, cfg config, trainSet, testSet data.Dataset) []rankResult {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	groups, err := local.NewGroups(ctx, n)
	if err != nil {
		t.Fatal(err)
	}
	res := make([]rankResult, n)
	var wg sync.WaitGroup
	for r, pg := range groups {
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer pg.Close()
			var buf bytes.Buffer
			res[r].hist, res[r].model, res[r].err = train(ctx, pg, cfg, trainSet, testSet, &buf)
			res[r].out = buf.String()
		}()
	}
	wg.Wait()
	for r := range res {
		if res[r].err != nil {
			t.Fatalf("rank %d: %v\noutput:\n%s", r, res[r].err, res[r].out)
		}
	}
	return res
}

func loadSynthetic(t *testing.T) (trainSet, testSet *data.InMemory) {
	t.Helper()
	dir := t.TempDir()
	writeSynthetic(t, dir, 192, 80)
	trainSet, testSet, err := loadFashion(context.Background(), dir, false)
	if err != nil {
		t.Fatal(err)
	}
	return trainSet, testSet
}

// stateOf copies a model's state_dict.
func stateOf(m models.Module) map[string][]float32 {
	out := map[string][]float32{}
	for _, p := range models.StateDict(m) {
		out[p.Name] = append([]float32(nil), p.Value.Float32s()...)
	}
	return out
}

func sameState(t *testing.T, what string, a, b map[string][]float32) {
	t.Helper()
	if len(a) != len(b) {
		t.Fatalf("%s: %d entries vs %d", what, len(a), len(b))
	}
	for name, x := range a {
		y := b[name]
		if len(x) != len(y) {
			t.Fatalf("%s: %s has %d values vs %d", what, name, len(x), len(y))
		}
		for i := range x {
			if x[i] != y[i] {
				t.Fatalf("%s: %s[%d] = %v vs %v", what, name, i, x[i], y[i])
			}
		}
	}
}

// TestTrainTwoRanksAndResume trains for three epochs with two ranks and
// checks what they report and write; then it plays a run killed after its
// second epoch (a folder holding only the first two checkpoints), resumes
// it, and checks that the third epoch comes out bit for bit as in the run
// that was not interrupted: weights, optimizer state, learning rate and
// statistics.
func TestTrainTwoRanksAndResume(t *testing.T) {
	before := runtime.NumGoroutine()
	trainSet, testSet := loadSynthetic(t)

	outA := t.TempDir()
	straight := runRanks(t, 2, testConfig(outA, 3), trainSet, testSet)
	h := straight[0].hist
	if len(h) != 3 || h[0].Epoch != 1 || h[2].Epoch != 3 {
		t.Fatalf("history %+v, want epochs 1 to 3", h)
	}
	if !(h[2].TrainLoss < h[0].TrainLoss) || !(h[1].TrainLoss < h[0].TrainLoss) {
		t.Errorf("training loss did not decrease: %v, %v, %v", h[0].TrainLoss, h[1].TrainLoss, h[2].TrainLoss)
	}
	if h[2].TestAcc < 0.5 {
		t.Errorf("test accuracy %.2f after three epochs on separable data, want at least 0.5", h[2].TestAcc)
	}
	if !(h[0].LR == 0.02 && h[1].LR < h[0].LR && h[2].LR < h[1].LR) {
		t.Errorf("learning rates %v, %v, %v: want 0.02 annealed down", h[0].LR, h[1].LR, h[2].LR)
	}
	// Every rank sees the same, all-reduced, statistics, and the replicas
	// hold the same weights.
	for r := range straight {
		if len(straight[r].hist) != 3 || straight[r].hist[2].TestAcc != h[2].TestAcc || straight[r].hist[2].TrainLoss != h[2].TrainLoss {
			t.Errorf("rank %d history %+v differs from rank 0's %+v", r, straight[r].hist, h)
		}
	}
	sameState(t, "rank 0 vs rank 1", stateOf(straight[0].model), stateOf(straight[1].model))
	if straight[1].out != "" {
		t.Errorf("rank 1 printed %q; only rank 0 reports", straight[1].out)
	}
	for _, want := range []string{"epoch 1/3  50%", "epoch 3/3 100%", "ETA", "test accuracy", "checkpoint-epoch003.safetensors"} {
		if !strings.Contains(straight[0].out, want) {
			t.Errorf("rank 0 output lacks %q:\n%s", want, straight[0].out)
		}
	}
	for e := 1; e <= 3; e++ {
		f, err := checkpoint.Load(checkpointPath(outA, e))
		if err != nil {
			t.Fatal(err)
		}
		for _, want := range []string{"0.weight", "0.bias", "optimizer.state.0.momentum_buffer", "optimizer.param_groups.0.lr"} {
			if _, ok := f.Get(want); !ok {
				t.Errorf("checkpoint %d lacks %s (has %v)", e, want, f.Names())
			}
		}
		if f.Metadata["epoch"] != strconv.Itoa(e) || f.Metadata["scheduler"] == "" {
			t.Errorf("checkpoint %d metadata %v", e, f.Metadata)
		}
	}
	pngFile, err := os.Open(filepath.Join(outA, "curves.png"))
	if err != nil {
		t.Fatal(err)
	}
	img, err := png.Decode(pngFile)
	pngFile.Close()
	if err != nil {
		t.Fatalf("curves.png: %v", err)
	}
	if b := img.Bounds(); b.Dx() != plotW || b.Dy() != plotH {
		t.Errorf("curves.png is %v, want %dx%d", b, plotW, plotH)
	}

	// The same run, killed after epoch 2, resumed.
	outB := t.TempDir()
	for e := 1; e <= 2; e++ {
		b, err := os.ReadFile(checkpointPath(outA, e))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(checkpointPath(outB, e), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	cfg := testConfig(outB, 3)
	cfg.Resume = true
	resumed := runRanks(t, 2, cfg, trainSet, testSet)
	out := resumed[0].out
	if !strings.Contains(out, "2 epoch(s) done") || strings.Contains(out, "epoch 1/3") || strings.Contains(out, "epoch 2/3") || !strings.Contains(out, "epoch 3/3") {
		t.Errorf("the resumed run did not train epoch 3 alone:\n%s", out)
	}
	if strings.Contains(out, "note:") {
		t.Errorf("the resumed run reports changed settings:\n%s", out)
	}
	rh := resumed[0].hist
	if len(rh) != 3 || rh[0] != h[0] || rh[1] != h[1] {
		t.Fatalf("resumed history %+v, want the first two epochs of %+v and a third", rh, h)
	}
	if a, b := h[2], rh[2]; a.TrainLoss != b.TrainLoss || a.TestAcc != b.TestAcc || a.TestLoss != b.TestLoss || a.LR != b.LR {
		t.Errorf("third epoch: uninterrupted %+v, resumed %+v", a, b)
	}
	sameState(t, "resumed ranks", stateOf(resumed[0].model), stateOf(resumed[1].model))
	sameState(t, "resumed vs uninterrupted", stateOf(straight[0].model), stateOf(resumed[0].model))
	fa, err := checkpoint.Load(checkpointPath(outA, 3))
	if err != nil {
		t.Fatal(err)
	}
	fb, err := checkpoint.Load(checkpointPath(outB, 3))
	if err != nil {
		t.Fatal(err)
	}
	if strings.Join(fa.Names(), ",") != strings.Join(fb.Names(), ",") {
		t.Fatalf("checkpoint entries differ: %v vs %v", fa.Names(), fb.Names())
	}
	for _, n := range fa.Names() {
		x, _ := fa.Get(n)
		y, _ := fb.Get(n)
		if !equalDense(x, y) {
			t.Errorf("checkpoint entry %s differs between the resumed and the uninterrupted run", n)
		}
	}
	if fa.Metadata["scheduler"] != fb.Metadata["scheduler"] {
		t.Errorf("scheduler state %s, resumed %s", fa.Metadata["scheduler"], fb.Metadata["scheduler"])
	}

	// Resuming a finished run has nothing to do.
	again := runRanks(t, 2, cfg, trainSet, testSet)
	if !strings.Contains(again[0].out, "nothing to do") || len(again[0].hist) != 3 {
		t.Errorf("resuming a finished run: %d epochs, output:\n%s", len(again[0].hist), again[0].out)
	}

	waitGoroutines(t, before)
}

func denseBytes(t *tensor.Dense) []byte {
	var b bytes.Buffer
	binary.Write(&b, binary.LittleEndian, t.Data())
	return b.Bytes()
}

// waitGoroutines fails when goroutines started by the test are still
// running after a grace period.
func waitGoroutines(t *testing.T, before int) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for runtime.NumGoroutine() > before && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	if n := runtime.NumGoroutine(); n > before {
		buf := make([]byte, 1<<16)
		t.Errorf("%d goroutines before, %d after:\n%s", before, n, buf[:runtime.Stack(buf, true)])
	}
}

// TestRunSingleProcess drives the command through its flags, without a
// launcher (one rank), on the synthetic files.
func TestRunSingleProcess(t *testing.T) {
	for _, v := range []string{"RANK", "WORLD_SIZE", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID"} {
		if _, ok := os.LookupEnv(v); ok {
			t.Skipf("%s is set: this test runs the command as a lone process", v)
		}
	}
	dir, out := t.TempDir(), t.TempDir()
	writeSynthetic(t, dir, 64, 20)
	var buf bytes.Buffer
	args := []string{"-data", dir, "-epochs", "1", "-batch", "16", "-limit", "48", "-out", out, "-progress", "lines", "-every", "25"}
	if err := run(context.Background(), args, &buf); err != nil {
		t.Fatalf("%v\n%s", err, buf.String())
	}
	got := buf.String()
	for _, want := range []string{"1 rank(s)", "training on 48 examples", "epoch 1/1  33% 1/3", "epoch 1/1 100% 3/3", "test accuracy", "(20 images)"} {
		if !strings.Contains(got, want) {
			t.Errorf("output lacks %q:\n%s", want, got)
		}
	}
	if _, err := os.Stat(filepath.Join(out, "curves.png")); err != nil {
		t.Error(err)
	}
	// -check-data finds the files.
	buf.Reset()
	if err := run(context.Background(), []string{"-data", dir, "-check-data"}, &buf); err != nil || !strings.Contains(buf.String(), "64 training and 20 test images") {
		t.Errorf("-check-data: %v, %q", err, buf.String())
	}
	// A fresh run into the same folder replaces the earlier run's checkpoints.
	buf.Reset()
	if err := run(context.Background(), args, &buf); err != nil {
		t.Fatalf("%v\n%s", err, buf.String())
	}
	if !strings.Contains(buf.String(), "removed 1 checkpoint(s)") {
		t.Errorf("second fresh run:\n%s", buf.String())
	}
	// A run with -resume and the same -epochs has nothing to train.
	buf.Reset()
	if err := run(context.Background(), append(args, "-resume"), &buf); err != nil {
		t.Fatalf("%v\n%s", err, buf.String())
	}
	if !strings.Contains(buf.String(), "nothing to do") {
		t.Errorf("resume output:\n%s", buf.String())
	}
}

// TestMissingData checks that a folder without the files gives an error
// that says how to get them.
func TestMissingData(t *testing.T) {
	err := run(context.Background(), []string{"-data", t.TempDir(), "-check-data"}, io.Discard)
	if !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("-check-data: got %v, want an error wrapping fs.ErrNotExist", err)
	}
	err = run(context.Background(), []string{"-data", t.TempDir(), "-out", ""}, io.Discard)
	if !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("got %v, want an error wrapping fs.ErrNotExist", err)
	}
	for _, want := range []string{"dataset-fashion-mnist", "TANDEM_DATA", "-download"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not mention %q", err, want)
		}
	}
}

// TestBadFlags checks that nonsense settings are refused before training.
func TestBadFlags(t *testing.T) {
	for _, args := range [][]string{
		{"-optim", "rmsprop"},
		{"-progress", "fancy"},
		{"-schedule", "step"},
		{"-epochs", "0"},
		{"extra"},
	} {
		if err := run(context.Background(), args, io.Discard); err == nil {
			t.Errorf("run %v succeeded", args)
		}
	}
}
