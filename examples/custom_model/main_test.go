package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	G "gorgonia.org/gorgonia"
	"gorgonia.org/tensor"

	"github.com/stretchr/testify/assert"
	"github.com/tandemml/tandem/checkpoint"
	"github.com/tandemml/tandem/comm"
	"github.com/tandemml/tandem/comm/commtest"
	"github.com/tandemml/tandem/data"
	"github.com/tandemml/tandem/internal/childtest"
	"github.com/tandemml/tandem/internal/testkit"
	"github.com/tandemml/tandem/models"
	"github.com/tandemml/tandem/optim"
)

// trainRanks runs the tutorial on world goroutine ranks; only rank 0 may
// print.
func trainRanks(t *testing.T, world int, c config) ([]*result, string) {
	t.Helper()
	ctx := testkit.Context(t, 2*time.Minute)
	res := make([]*result, world)
	outs := commtest.LocalRanks(t, ctx, world, func(pg *comm.ProcessGroup, out io.Writer) (err error) {
		res[pg.Rank()], err = train(ctx, pg, c, out)
		return err
	})
	for r := 1; r < world; r++ {
		assert.Emptyf(t, outs[r], "rank %d printed; only rank 0 reports", r)
	}
	return res, outs[0]
}

// weightsOf returns the model's parameters as float64s, in state_dict order.
func weightsOf(m *Recommender) [][]float64 {
	var out [][]float64
	for _, p := range m.Params() {
		var v []float64
		switch p.Value.Dtype() {
		case tensor.Float32:
			for _, x := range p.Value.Float32s() {
				v = append(v, float64(x))
			}
		default:
			v = append(v, p.Value.Float64s()...)
		}
		out = append(out, v)
	}
	return out
}

// TestTutorial trains the tutorial's default float32 run on two goroutine
// ranks: the validation error falls well below that of predicting 0, the
// replicas end identical, and rank 0 reports what the README shows.
func TestTutorial(t *testing.T) {
	c := defaultConfig()
	res, out := trainRanks(t, 2, c)
	r := res[0]
	if !(r.lastVal < r.baseline/10) {
		t.Errorf("validation MSE %.4f after training; want a tenth of predicting 0's (%.4f) or less", r.lastVal, r.baseline)
	}
	if !(r.lastVal < r.firstVal/20) {
		t.Errorf("validation MSE went from %.4f to %.4f; want it at least 20 times lower", r.firstVal, r.lastVal)
	}
	w0, w1 := weightsOf(r.model), weightsOf(res[1].model)
	for i := range w0 {
		if !slices.Equal(w0[i], w1[i]) {
			t.Fatalf("parameter %q differs across the ranks", r.model.Params()[i].Name)
		}
	}
	steps := c.epochs * (c.n / 2 / c.batch)
	if r.stats.Steps != int64(steps) || len(r.losses) != steps {
		t.Errorf("%d synchronized steps and %d losses, want %d", r.stats.Steps, len(r.losses), steps)
	}
	for _, want := range []string{
		"rank 0 of 2: float32 model, 400 parameters (mix, user.weight, user.bias, item.weight, item.bias) in 1 bucket(s)",
		"validation MSE", "epoch  1  train loss", "epoch  8  train loss",
		fmt.Sprintf("%d steps, %d bucket reductions", steps, steps),
	} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	t.Log("\n" + out)
}

// parityConfig is a short float64 run with a bucket per parameter, so that
// buckets are reduced while the backward pass goes on.
func parityConfig() config {
	c := defaultConfig()
	c.dtype = tensor.Float64
	c.epochs, c.batch, c.n, c.val, c.dim = 2, 4, 120, 16, 6
	c.lr = 0.02
	c.decay = 0.01
	c.bucket = 1e-5
	return c
}

// reference trains the same model in one process on the concatenated
// batches of world ranks: at step k, rank 0's k-th batch, then rank 1's,
// ..., as one batch, with the graph run by gorgonia's TapeMachine, the
// gradients copied by the Builder and Adam over the module's parameters.
// It returns every step's loss and the final model.
func reference(t *testing.T, world int, c config) ([]float64, *Recommender) {
	t.Helper()
	model, err := NewRecommender(c.dim, c.dtype, rand.New(rand.NewPCG(c.seed, 0))) // rank 0's weights
	if err != nil {
		t.Fatal(err)
	}
	ds, err := makeData(c.n, c.seed, c.dtype)
	if err != nil {
		t.Fatal(err)
	}
	loaders := make([]*data.Loader, world)
	for r := range world {
		s, err := data.NewDistributedSampler(ds.Len(), world, r, data.Shuffle(c.seed))
		if err != nil {
			t.Fatal(err)
		}
		if loaders[r], err = data.NewTensorLoader(ds, c.batch, data.WithSampler(s), data.DropLast()); err != nil {
			t.Fatal(err)
		}
	}
	g, err := build(model, c.batch*world, c.dtype, c.decay)
	if err != nil {
		t.Fatal(err)
	}
	vm := G.NewTapeMachine(g.b.Graph())
	defer vm.Close()
	opt, err := optim.NewAdam(model.Params(), optim.LR(c.lr))
	if err != nil {
		t.Fatal(err)
	}
	inputs := map[string]*tensor.Dense{"user": g.user.Value().(*tensor.Dense), "item": g.item.Value().(*tensor.Dense), "target": g.target.Value().(*tensor.Dense)}
	ctx := context.Background()
	var losses []float64
	for epoch := range c.epochs {
		batches := make([][]*data.Batch, world)
		for r := range world {
			for b, err := range loaders[r].Epoch(ctx, epoch) {
				if err != nil {
					t.Fatal(err)
				}
				batches[r] = append(batches[r], b)
			}
		}
		for k := range batches[0] {
			for name, dst := range inputs {
				var all []float64
				for r := range world {
					all = append(all, batches[r][k].Tensor(name).Float64s()...)
				}
				copy(dst.Float64s(), all)
			}
			if err := vm.RunAll(); err != nil {
				t.Fatal(err)
			}
			if err := g.b.CopyGrads(); err != nil {
				t.Fatal(err)
			}
			if err := opt.Step(); err != nil {
				t.Fatal(err)
			}
			l, err := scalar(g.loss.Value())
			if err != nil {
				t.Fatal(err)
			}
			losses = append(losses, l)
			vm.Reset()
		}
	}
	return losses, model
}

// TestParity: DDP over 2 and 3 goroutine ranks, each with its share of
// every batch through the DistributedSampler and its own initial weights,
// equals one process on the concatenated batch to 1e-12 in float64: every
// step's loss (averaged over the ranks) and every rank's final weights.
// The buckets are reduced during the backward pass (Stats shows buckets
// that started before it ended).
func TestParity(t *testing.T) {
	for _, world := range []int{2, 3} {
		t.Run(strconv.Itoa(world), func(t *testing.T) {
			c := parityConfig()
			refLoss, refModel := reference(t, world, c)
			res, _ := trainRanks(t, world, c)
			steps := c.epochs * (c.n / world / c.batch)
			if len(refLoss) != steps {
				t.Fatalf("the reference took %d steps, want %d", len(refLoss), steps)
			}
			lossDiff := 0.0
			for s := range steps {
				mean := 0.0
				for r := range world {
					if len(res[r].losses) != steps {
						t.Fatalf("rank %d took %d steps, want %d", r, len(res[r].losses), steps)
					}
					mean += res[r].losses[s]
				}
				mean /= float64(world)
				lossDiff = math.Max(lossDiff, math.Abs(mean-refLoss[s]))
			}
			weightDiff := 0.0
			ref := weightsOf(refModel)
			for r := range world {
				for i, w := range weightsOf(res[r].model) {
					for j := range w {
						weightDiff = math.Max(weightDiff, math.Abs(w[j]-ref[i][j]))
					}
				}
			}
			t.Logf("%d ranks, %d steps: max |loss - reference| %.3g, max |weight - reference| %.3g; loss %.4f -> %.4f",
				world, steps, lossDiff, weightDiff, refLoss[0], refLoss[steps-1])
			if lossDiff > 1e-12 || weightDiff > 1e-12 {
				t.Errorf("over %d ranks: the loss differs by %.3g and the weights by %.3g from one process on the whole batch; want at most 1e-12", world, lossDiff, weightDiff)
			}
			if !(refLoss[steps-1] < refLoss[0]/2) {
				t.Errorf("the loss went from %.4f to %.4f; the parity run should train", refLoss[0], refLoss[steps-1])
			}
			st := res[0].stats
			if st.Steps != int64(steps) || st.BucketsReduced != int64(5*steps) {
				t.Errorf("stats %v: want %d steps and a bucket per parameter (5 per step)", st, steps)
			}
			if st.BucketsOverlapped == 0 {
				t.Errorf("no bucket started before the backward pass ended (stats %v)", st)
			}
		})
	}
}

// TestCheckpointResume trains two epochs with a checkpoint, then resumes
// for a third: the file holds the module under PyTorch's state_dict names
// and Adam's state, and the resumed epoch's losses are bit for bit those
// of an uninterrupted three-epoch run.
func TestCheckpointResume(t *testing.T) {
	c := parityConfig()
	c.dtype = tensor.Float32 // the default dtype; the file keeps float32 as it is
	full := c
	full.epochs = 3
	want, _ := trainRanks(t, 2, full)

	c.ckpt = filepath.Join(t.TempDir(), "recommender.safetensors")
	c.epochs = 2
	trainRanks(t, 2, c)
	f, err := checkpoint.Load(c.ckpt)
	if err != nil {
		t.Fatal(err)
	}
	if f.Metadata["epoch"] != "2" {
		t.Errorf("metadata epoch %q, want 2", f.Metadata["epoch"])
	}
	for _, name := range []string{"mix", "user.weight", "user.bias", "item.weight", "item.bias", "optimizer.state.0.exp_avg", "optimizer.state.4.exp_avg_sq"} {
		if _, ok := f.Get(name); !ok {
			t.Errorf("the checkpoint lacks %q; it holds %v", name, f.Names())
		}
	}
	if w, _ := f.Get("user.weight"); w != nil && (!w.Shape().Eq(tensor.Shape{c.dim, userDim}) || w.Dtype() != tensor.Float32) {
		t.Errorf("user.weight is %v %v; want float32 (%d, %d) as torch.nn.Linear(%d, %d) keeps it", w.Dtype(), w.Shape(), c.dim, userDim, userDim, c.dim)
	}

	c.epochs = 3
	got, out := trainRanks(t, 2, c)
	if got[0].startEpoch != 2 || !strings.Contains(out, "resumed from "+c.ckpt+" after epoch 2") {
		t.Fatalf("start epoch %d; want a resume after epoch 2:\n%s", got[0].startEpoch, out)
	}
	per := c.n / 2 / c.batch
	for r := range 2 {
		if !slices.Equal(got[r].losses, want[r].losses[2*per:]) {
			t.Errorf("rank %d: the resumed epoch's losses %v differ from the uninterrupted run's %v", r, got[r].losses, want[r].losses[2*per:])
		}
		w, g := weightsOf(want[r].model), weightsOf(got[r].model)
		for i := range w {
			if !slices.Equal(w[i], g[i]) {
				t.Errorf("rank %d: parameter %q differs from the uninterrupted run's", r, got[r].model.Params()[i].Name)
			}
		}
	}

	// The file loads strictly into a fresh module once the optimizer's
	// entries are left out: exactly the module's state_dict.
	fresh, err := NewRecommender(c.dim, c.dtype, rand.New(rand.NewPCG(99, 99)))
	if err != nil {
		t.Fatal(err)
	}
	var sd []checkpoint.Named
	for _, nt := range f.Tensors {
		if !strings.HasPrefix(nt.Name, optimPrefix) {
			sd = append(sd, nt)
		}
	}
	var buf bytes.Buffer
	if err := checkpoint.Encode(&buf, sd, nil); err != nil {
		t.Fatal(err)
	}
	g, err := checkpoint.Decode(buf.Bytes())
	if err != nil {
		t.Fatal(err)
	}
	if err := checkpoint.CopyInto(fresh, g); err != nil {
		t.Errorf("the module's entries do not load strictly into a fresh Recommender: %v", err)
	}
}

// TestBadCheckpoint: a checkpoint that lacks one of the module's entries
// is refused, naming the entry.
func TestBadCheckpoint(t *testing.T) {
	c := parityConfig()
	c.ckpt = filepath.Join(t.TempDir(), "bad.safetensors")
	m, err := NewRecommender(c.dim, c.dtype, rand.New(rand.NewPCG(1, 1)))
	if err != nil {
		t.Fatal(err)
	}
	var ts []checkpoint.Named
	for _, nt := range checkpoint.StateTensors(m) {
		if nt.Name != "item.bias" {
			ts = append(ts, nt)
		}
	}
	if err := checkpoint.Save(c.ckpt, ts, map[string]string{"epoch": "1"}); err != nil {
		t.Fatal(err)
	}
	opt, err := optim.NewAdam(m.Params(), optim.LR(0.1))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := load(c.ckpt, m, opt); err == nil || !strings.Contains(err.Error(), `lacks the model's "item.bias"`) {
		t.Errorf("load: %v; want an error naming item.bias", err)
	}
}

// TestModule: the Recommender is a models.Module with PyTorch's
// state_dict, and its one-input Forward embeds users.
func TestModule(t *testing.T) {
	m, err := NewRecommender(8, tensor.Float32, rand.New(rand.NewPCG(1, 2)))
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, p := range models.StateDict(m) {
		got = append(got, fmt.Sprintf("%s%v", p.Name, p.Value.Shape()))
	}
	want := []string{"mix(8, 8)", "user.weight(8, 4)", "user.bias(8)", "item.weight(8, 3)", "item.bias(8)"}
	if !slices.Equal(got, want) {
		t.Errorf("state_dict %v, want %v", got, want)
	}
	b := models.NewBuilder(nil)
	x := b.Bind("user", tensor.New(tensor.Of(tensor.Float32), tensor.WithShape(5, userDim)))
	h, err := m.Forward(b, x)
	if err != nil {
		t.Fatal(err)
	}
	if !h.Shape().Eq(tensor.Shape{5, 8}) {
		t.Errorf("Forward gives shape %v, want (5, 8)", h.Shape())
	}
}

// TestHelperProcess is not a test: it is a rank of TestProcesses, run as a
// process of its own with the environment tandem run would set.
func TestHelperProcess(t *testing.T) {
	if os.Getenv("CUSTOM_MODEL_HELPER") != "1" {
		t.Skip("helper process for TestProcesses")
	}
	c := defaultConfig()
	c.epochs = 2
	c.ckpt = os.Getenv("CUSTOM_MODEL_CKPT")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := run(ctx, c, os.Stdout); err != nil {
		fmt.Println("ERR", err)
		os.Exit(1)
	}
	os.Exit(0)
}

// TestProcesses runs the tutorial's main path, comm.InitFromEnv included,
// as two processes over TCP, as `tandem run -nproc 2` does, with a
// checkpoint that rank 0 writes.
func TestProcesses(t *testing.T) {
	if testing.Short() {
		t.Skip("starts processes")
	}
	ckpt := filepath.Join(t.TempDir(), "recommender.safetensors")
	outs := childtest.Ranks(t, 2, 90*time.Second, "TestHelperProcess", "CUSTOM_MODEL_HELPER=1", "CUSTOM_MODEL_CKPT="+ckpt)
	for _, want := range []string{"rank 0 of 2: float32 model", "epoch  2  train loss", "checkpoint " + ckpt + " holds epoch 2"} {
		if !strings.Contains(outs[0], want) {
			t.Errorf("rank 0's output lacks %q:\n%s", want, outs[0])
		}
	}
	if strings.Contains(outs[1], "ERR") || strings.Contains(outs[1], "exit") || strings.Contains(outs[1], "epoch") {
		t.Errorf("rank 1: %q", outs[1])
	}
	if _, err := checkpoint.Load(ckpt); err != nil {
		t.Errorf("rank 0's checkpoint: %v", err)
	}
}
