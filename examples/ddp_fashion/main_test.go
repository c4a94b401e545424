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
	"github.com/tandemml/tandem/internal/testkit"
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

// runRanks trains with n goroutine ranks over comm/local groups and fails
// the test if a rank fails.
func runRanks(t *testing.T, n int, cfg config, trainSet, testSet data.Dataset) []rankResult {
	t.Helper()
	res := runRanksErr(t, n, cfg, trainSet, testSet)
	for r := range res {
		if res[r].err != nil {
			t.Fatalf("rank %d: %v\noutput:\n%s", r, res[r].err, res[r].out)
		}
	}
	return res
}

// runRanksErr trains with n goroutine ranks over comm/local groups.
func runRanksErr(t *testing.T, n int, cfg config, trainSet, testSet data.Dataset) []rankResult {
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

	// The same run with its two newest checkpoints damaged (epoch 3 cut
	// short, a bit of epoch 2's data flipped) and the temporary files of
	// saves killed long ago and of one under way: it resumes from epoch 1,
	// says why it skipped the others, and ends as the uninterrupted run.
	outC := t.TempDir()
	for e := 1; e <= 3; e++ {
		b, err := os.ReadFile(checkpointPath(outA, e))
		if err != nil {
			t.Fatal(err)
		}
		switch e {
		case 2:
			b[len(b)-5] ^= 0x04
		case 3:
			b = b[:len(b)/2]
		}
		if err := os.WriteFile(checkpointPath(outC, e), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	staleTemp := filepath.Join(outC, ".checkpoint-epoch002.safetensors.tandem-tmp.otherhost.4242.123")
	liveTemp := filepath.Join(outC, ".checkpoint-epoch004.safetensors.tandem-tmp.otherhost.4242.456")
	for _, p := range []string{staleTemp, liveTemp} {
		if err := os.WriteFile(p, make([]byte, 1000), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	longAgo := time.Now().Add(-2 * checkpoint.StaleTempAge)
	if err := os.Chtimes(staleTemp, longAgo, longAgo); err != nil {
		t.Fatal(err)
	}
	cfg = testConfig(outC, 3)
	cfg.Resume = true
	fallback := runRanks(t, 2, cfg, trainSet, testSet)
	out = fallback[0].out
	for _, want := range []string{
		"removed " + staleTemp + ", left by a save that was interrupted",
		"skipping " + checkpointPath(outC, 3) + ": checkpoint: malformed safetensors file: ",
		"skipping " + checkpointPath(outC, 2) + ": checkpoint: file does not match its checksum",
		"resumed from " + checkpointPath(outC, 1) + ": 1 epoch(s) done",
		"epoch 2/3", "epoch 3/3",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("resuming past damaged checkpoints: output lacks %q:\n%s", want, out)
		}
	}
	if _, err := os.Stat(staleTemp); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("the stale temporary file is still there: %v", err)
	}
	if _, err := os.Stat(liveTemp); err != nil {
		t.Errorf("the temporary file of a save under way was removed: %v", err)
	}
	sameState(t, "resumed past damaged checkpoints vs uninterrupted", stateOf(straight[0].model), stateOf(fallback[0].model))
	if fh := fallback[0].hist; len(fh) != 3 || fh[0] != h[0] || fh[2].TestAcc != h[2].TestAcc || fh[2].TrainLoss != h[2].TrainLoss {
		t.Errorf("history after the fallback %+v, want %+v", fh, h)
	}
	for e := 1; e <= 3; e++ { // the damaged files were replaced by sound ones
		if f, err := checkpoint.Load(checkpointPath(outC, e)); err != nil || f.Checksum == "" {
			t.Errorf("checkpoint %d after the fallback run: %v", e, err)
		}
	}

	testkit.AssertNoLeak(t, before)
}

// TestDivergenceKeepsLastGoodCheckpoint makes one rank's batch hold a NaN
// in the middle of epoch 2 (a corrupt input record) and checks that every
// rank stops at that step with an error naming the epoch, the step and the
// rank whose loss went NaN, that nothing is saved for epoch 2 and the
// checkpoint of epoch 1 is left intact, and that the exit status is 4.
func TestDivergenceKeepsLastGoodCheckpoint(t *testing.T) {
	before := runtime.NumGoroutine()
	trainSet, testSet := loadSynthetic(t)
	out := t.TempDir()
	cfg := testConfig(out, 2)
	cfg.nanInput = &nanInput{Epoch: 2, Step: 3, Rank: 1}
	res := runRanksErr(t, 2, cfg, trainSet, testSet)
	good := checkpointPath(out, 1)
	for r, rr := range res {
		var d *divergedError
		if !errors.As(rr.err, &d) || exitCode(rr.err) != exitDiverged {
			t.Fatalf("rank %d: %v (exit status %d), want a divergence (exit status %d)\noutput:\n%s", r, rr.err, exitCode(rr.err), exitDiverged, rr.out)
		}
		msg := rr.err.Error()
		for _, want := range []string{"training diverged at epoch 2/2, step 3", "gradients", "rank 1 NaN", "stopped without saving", "the last good checkpoint is " + good + ", which -resume continues from"} {
			if !strings.Contains(msg, want) {
				t.Errorf("rank %d: error %q lacks %q", r, msg, want)
			}
		}
		if strings.Contains(msg, "rank 0 NaN") {
			t.Errorf("rank %d: error %q blames rank 0, whose batch was sound", r, msg)
		}
		if len(rr.hist) != 1 {
			t.Errorf("rank %d: history of %d epochs, want epoch 1 only", r, len(rr.hist))
		}
	}
	t.Logf("rank 0: %v", res[0].err)
	if !strings.Contains(res[0].out, "epoch 1/2: train loss") || strings.Contains(res[0].out, "epoch 2/2: train loss") {
		t.Errorf("output:\n%s", res[0].out)
	}
	ents, _ := os.ReadDir(out)
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	if strings.Join(names, " ") != "checkpoint-epoch001.safetensors curves.png" {
		t.Errorf("folder holds %q, want epoch 1's checkpoint and the plot only", names)
	}
	f, err := checkpoint.Load(good)
	if err != nil {
		t.Fatal(err)
	}
	if err := checkpoint.CheckFinite(f.Tensors); err != nil {
		t.Error(err)
	}

	// Resumed without the bad record, the run goes on from epoch 1.
	cfg.nanInput = nil
	cfg.Resume = true
	again := runRanks(t, 2, cfg, trainSet, testSet)
	if !strings.Contains(again[0].out, "resumed from "+good) || len(again[0].hist) != 2 {
		t.Errorf("resuming after the divergence:\n%s", again[0].out)
	}
	testkit.AssertNoLeak(t, before)
}

func denseBytes(t *tensor.Dense) []byte {
	var b bytes.Buffer
	binary.Write(&b, binary.LittleEndian, t.Data())
	return b.Bytes()
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

// TestRunDivergesWithHugeLR runs the command with a learning rate that
// blows the weights up within the first epoch: it stops with exit status 4
// and a message saying where and that nothing was saved, and leaves no
// checkpoint or temporary file behind. (The failure this replaces was
// "json: unsupported value: NaN" while writing the history.)
func TestRunDivergesWithHugeLR(t *testing.T) {
	for _, v := range []string{"RANK", "WORLD_SIZE", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID"} {
		if _, ok := os.LookupEnv(v); ok {
			t.Skipf("%s is set: this test runs the command as a lone process", v)
		}
	}
	dir, out := t.TempDir(), t.TempDir()
	writeSynthetic(t, dir, 64, 20)
	args := []string{"-data", dir, "-batch", "16", "-limit", "48", "-out", out, "-progress", "off", "-epochs", "2", "-lr", "1e5"}
	var buf bytes.Buffer
	err := run(context.Background(), args, &buf)
	if exitCode(err) != exitDiverged {
		t.Fatalf("exit status %d (%v), want %d\n%s", exitCode(err), err, exitDiverged, buf.String())
	}
	for _, want := range []string{"training diverged at epoch 1/2", "before any checkpoint was written"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q lacks %q", err, want)
		}
	}
	if !strings.Contains(err.Error(), "NaN") && !strings.Contains(err.Error(), "Inf") {
		t.Errorf("error %q names no NaN or infinite value", err)
	}
	if ents, _ := os.ReadDir(out); len(ents) != 0 {
		t.Errorf("the folder holds %v after a run that diverged in its first epoch", ents)
	}
}
