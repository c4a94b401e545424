// Command custom_model trains a model Tandem does not ship, written by the
// user: a recommender with two inputs (a user's features and an item's), a
// parameter of its own, two named child layers and a hand-written loss,
// data-parallel over the ranks of a job with ddp.NewGraph. It learns a
// synthetic rating task it makes itself, served by data.TensorDataset and a
// DistributedSampler, and saves a checkpoint with PyTorch's state_dict
// names after every epoch. Run it under the launcher:
//
//	go run ./cmd/tandem run -nproc 2 -- go run ./examples/custom_model
//
// See README.md for the tutorial.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	G "gorgonia.org/gorgonia"
	"gorgonia.org/tensor"

	"github.com/tandemml/tandem/checkpoint"
	"github.com/tandemml/tandem/comm"
	"github.com/tandemml/tandem/data"
	"github.com/tandemml/tandem/ddp"
	"github.com/tandemml/tandem/models"
	"github.com/tandemml/tandem/optim"
)

// config is what the flags set.
type config struct {
	epochs  int          // passes over the training set
	batch   int          // examples per rank and step
	n, val  int          // training and validation examples
	dim     int          // the towers' width
	lr      float64      // Adam's learning rate
	decay   float64      // the loss's L2 penalty on Mix
	dtype   tensor.Dtype // float32 (the default) or float64
	seed    uint64       // the data's seed and the ranks' initial weights'
	bucket  float64      // bucket cap in MiB
	ckpt    string       // checkpoint file ("" for none)
	timeout time.Duration
}

func defaultConfig() config {
	return config{epochs: 8, batch: 32, n: 4096, val: 1024, dim: 16, lr: 0.01, decay: 1e-4,
		dtype: tensor.Float32, seed: 1, bucket: ddp.DefaultBucketCapMB, timeout: 2 * time.Minute}
}

func main() {
	c := defaultConfig()
	f64 := false
	flag.IntVar(&c.epochs, "epochs", c.epochs, "passes over the training set")
	flag.IntVar(&c.batch, "batch", c.batch, "examples per rank and step")
	flag.IntVar(&c.n, "n", c.n, "training examples")
	flag.IntVar(&c.dim, "dim", c.dim, "width of the user and item towers")
	flag.Float64Var(&c.lr, "lr", c.lr, "Adam's learning rate")
	flag.Float64Var(&c.decay, "decay", c.decay, "weight of the L2 penalty on the mix matrix in the loss")
	flag.BoolVar(&f64, "float64", false, "train in float64 (the default is float32, as PyTorch's)")
	flag.Uint64Var(&c.seed, "seed", c.seed, "seed of the data and of the initial weights")
	flag.Float64Var(&c.bucket, "bucket-cap-mb", c.bucket, "bucket cap in MiB (try 0.0001: a bucket per parameter, reduced while backward goes on)")
	flag.StringVar(&c.ckpt, "checkpoint", "", "save the model and optimizer here after every epoch, and resume from it if it exists")
	flag.DurationVar(&c.timeout, "timeout", c.timeout, "give up after this long")
	flag.Parse()
	if f64 {
		c.dtype = tensor.Float64
	}
	ctx, cancel := context.WithTimeout(context.Background(), c.timeout)
	defer cancel()
	if err := run(ctx, c, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "custom_model:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, c config, w io.Writer) error {
	// Join the job, whoever launched it (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT).
	pg, err := comm.InitFromEnv(ctx)
	if err != nil {
		return err
	}
	defer pg.Close()
	_, err = train(ctx, pg, c, w)
	return err
}

// result is what train returns, for the tests.
type result struct {
	losses     []float64 // this rank's loss at every step
	firstVal   float64   // validation MSE before training (rank 0)
	lastVal    float64   // validation MSE after the last epoch (rank 0)
	baseline   float64   // validation MSE of predicting 0 (the targets' spread)
	startEpoch int       // the first epoch trained (after a resume)
	model      *Recommender
	stats      ddp.Stats
}

// train builds the model, wraps its training graph in DDP and trains it on
// this rank's share of the data; rank 0 reports and saves checkpoints.
func train(ctx context.Context, pg *comm.ProcessGroup, c config, w io.Writer) (*result, error) {
	rank, world := pg.Rank(), pg.Size()
	if rank != 0 {
		w = io.Discard
	}

	// 1. The model, written by the user. Every rank draws its own initial
	//    weights; DDP replaces them by rank 0's.
	model, err := NewRecommender(c.dim, c.dtype, rand.New(rand.NewPCG(c.seed, uint64(rank))))
	if err != nil {
		return nil, err
	}

	// 2. The data: the same synthetic set on every rank, each rank taking
	//    its share through a DistributedSampler. Gorgonia graphs have fixed
	//    shapes, so the loader drops a short last batch.
	train, err := makeData(c.n, c.seed, c.dtype)
	if err != nil {
		return nil, err
	}
	sampler, err := data.NewDistributedSampler(train.Len(), world, rank, data.Shuffle(c.seed))
	if err != nil {
		return nil, err
	}
	loader, err := data.NewTensorLoader(train, c.batch, data.WithSampler(sampler), data.DropLast())
	if err != nil {
		return nil, err
	}

	// 3. The training graph: the model's Score on two input nodes, the
	//    hand-written loss, and its backward pass.
	tg, err := build(model, c.batch, c.dtype, c.decay)
	if err != nil {
		return nil, err
	}

	// 4. Data parallelism over the graph: DDP checks every rank built the
	//    same graph, broadcasts rank 0's weights and averages the
	//    gradients in buckets. Its Params are the module's parameters
	//    (the same names, the same Value tensors) with the averaged
	//    gradient in Grad after every step.
	net, err := ddp.NewGraph(ctx, pg, ddp.GraphSpec{Graph: tg.b.Graph(), Loss: tg.loss, Params: tg.params, Grads: tg.grads},
		ddp.BucketCapMB(c.bucket))
	if err != nil {
		return nil, err
	}

	// 5. The optimizer reads those gradients and updates the module's
	//    weights in place; then the checkpoint to resume from, if any.
	opt, err := optim.NewAdam(net.Params(), optim.LR(c.lr))
	if err != nil {
		return nil, err
	}
	start, err := resume(ctx, pg, c.ckpt, model, opt)
	if err != nil {
		return nil, err
	}
	fmt.Fprintf(w, "rank 0 of %d: %s model, %d parameters (%s) in %d bucket(s)\n",
		world, c.dtype, countParams(model), paramNames(model), len(net.Buckets()))

	// The validation set, another 1024 examples, and a graph of its own:
	// a module builds into as many graphs as one likes.
	val, err := makeData(c.val, c.seed+1000, c.dtype)
	if err != nil {
		return nil, err
	}
	evaluate, baseline, err := validator(model, val, c.dtype)
	if err != nil {
		return nil, err
	}
	res := &result{model: model, baseline: baseline, startEpoch: start}
	if start > 0 {
		fmt.Fprintf(w, "resumed from %s after epoch %d\n", c.ckpt, start)
	}
	if res.firstVal, err = evaluate(); err != nil {
		return nil, err
	}
	fmt.Fprintf(w, "validation MSE %.4f at the start (predicting 0: %.4f)\n", res.firstVal, baseline)
	res.lastVal = res.firstVal

	// 6. The loop: one DDP step per batch, then Adam's update.
	for epoch := start; epoch < c.epochs; epoch++ {
		sum, mse, steps := 0.0, 0.0, 0
		for batch, err := range loader.Epoch(ctx, epoch) {
			if err != nil {
				return nil, err
			}
			l, err := net.Step(ctx, ddp.ByName(batch.Feeds()))
			if err != nil {
				return nil, fmt.Errorf("epoch %d, batch %d: %w", epoch+1, batch.Index, err)
			}
			if err := opt.Step(); err != nil {
				return nil, err
			}
			res.losses = append(res.losses, l)
			m, err := scalar(tg.mse.Value())
			if err != nil {
				return nil, err
			}
			sum, mse, steps = sum+l, mse+m, steps+1
		}
		means, err := meanOverRanks(ctx, pg, sum/float64(steps), mse/float64(steps))
		if err != nil {
			return nil, err
		}
		if rank == 0 {
			if res.lastVal, err = evaluate(); err != nil {
				return nil, err
			}
		}
		fmt.Fprintf(w, "epoch %2d  train loss %.4f  train MSE %.4f  validation MSE %.4f\n", epoch+1, means[0], means[1], res.lastVal)
		if c.ckpt != "" && rank == 0 {
			if err := save(c.ckpt, model, opt, epoch+1); err != nil {
				return nil, err
			}
		}
	}
	if c.ckpt != "" && rank == 0 {
		fmt.Fprintf(w, "checkpoint %s holds epoch %d\n", c.ckpt, c.epochs)
	}
	res.stats = net.Stats()
	st := res.stats
	fmt.Fprintf(w, "%d steps, %d bucket reductions, %d started before the backward pass ended\n", st.Steps, st.BucketsReduced, st.BucketsOverlapped)
	return res, nil
}

// validator returns a function computing the MSE of the model on val (one
// batch, its own graph under gorgonia's TapeMachine), and the MSE of
// predicting 0.
func validator(model *Recommender, val *data.TensorDataset, dt tensor.Dtype) (func() (float64, error), float64, error) {
	loader, err := data.NewTensorLoader(val, val.Len())
	if err != nil {
		return nil, 0, err
	}
	var batch *data.Batch
	for b, err := range loader.Epoch(context.Background(), 0) {
		if err != nil {
			return nil, 0, err
		}
		batch = b
	}
	buildMu.Lock()
	defer buildMu.Unlock()
	b := models.NewBuilder(nil, models.WithMode(models.Eval))
	user, item := b.Bind("user", batch.Tensor("user")), b.Bind("item", batch.Tensor("item"))
	target := b.Bind("target", batch.Tensor("target"))
	score, err := model.Score(b, user, item)
	if err != nil {
		return nil, 0, err
	}
	_, mse, err := model.Loss(b, score, target, 0)
	if err != nil {
		return nil, 0, err
	}
	baseline := 0.0
	t := batch.Tensor("target")
	for i := range val.Len() {
		v, _ := t.At(i)
		x, _ := scalar(v)
		baseline += x * x
	}
	baseline /= float64(val.Len())
	vm := G.NewTapeMachine(b.Graph())
	return func() (float64, error) {
		defer vm.Reset()
		if err := vm.RunAll(); err != nil {
			return 0, err
		}
		return scalar(mse.Value())
	}, baseline, nil
}

// optimPrefix prefixes the optimizer's entries in a checkpoint.
const optimPrefix = "optimizer."

// save writes the module's state_dict (PyTorch's names: "mix",
// "user.weight", ...) and Adam's state to path, atomically, with the
// number of epochs done in the metadata.
func save(path string, model *Recommender, opt *optim.Adam, epochs int) error {
	tensors := checkpoint.StateTensors(model)
	state := opt.State()
	for _, name := range slices.Sorted(maps.Keys(state)) {
		tensors = append(tensors, checkpoint.Named{Name: optimPrefix + name, Tensor: state[name]})
	}
	return checkpoint.Save(path, tensors, map[string]string{"epoch": strconv.Itoa(epochs)})
}

// resume loads path, when it exists, into the model and the optimizer and
// returns the number of epochs it holds (0 without a checkpoint). Every
// rank reads the file (a shared file system, as torch's tutorials assume;
// rank 0's weights would reach the others through DDP anyway, Adam's
// state would not), and the ranks check that they agree.
func resume(ctx context.Context, pg *comm.ProcessGroup, path string, model *Recommender, opt *optim.Adam) (int, error) {
	start, err := load(path, model, opt)
	if err != nil {
		return 0, err
	}
	t := tensor.New(tensor.WithShape(2), tensor.WithBacking([]float64{float64(start), -float64(start)}))
	if err := pg.AllReduce(ctx, t, comm.Max).Wait(ctx); err != nil {
		return 0, err
	}
	if hi, lo := t.Float64s()[0], -t.Float64s()[1]; hi != lo {
		return 0, fmt.Errorf("custom_model: the ranks found checkpoints of different epochs (%v to %v) at %s; every rank must read the same file", lo, hi, path)
	}
	return start, nil
}

func load(path string, model *Recommender, opt *optim.Adam) (int, error) {
	if path == "" {
		return 0, nil
	}
	f, err := checkpoint.Load(path)
	if errors.Is(err, fs.ErrNotExist) {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	epochs, err := strconv.Atoi(f.Metadata["epoch"])
	if err != nil || epochs < 1 {
		return 0, fmt.Errorf("custom_model: checkpoint %s: metadata \"epoch\" is %q, want a positive number", path, f.Metadata["epoch"])
	}
	state := map[string]*tensor.Dense{}
	for _, nt := range f.Tensors {
		if name, ok := strings.CutPrefix(nt.Name, optimPrefix); ok {
			state[name] = nt.Tensor
		}
	}
	for _, p := range models.StateDict(model) {
		if _, ok := f.Get(p.Name); !ok {
			return 0, fmt.Errorf("custom_model: checkpoint %s lacks the model's %q", path, p.Name)
		}
	}
	// NonStrict: the file also holds the optimizer's entries.
	if err := checkpoint.CopyInto(model, f, checkpoint.NonStrict()); err != nil {
		return 0, fmt.Errorf("custom_model: checkpoint %s: %w", path, err)
	}
	if err := opt.LoadState(state); err != nil {
		return 0, fmt.Errorf("custom_model: checkpoint %s: %w", path, err)
	}
	return epochs, nil
}

// scalar reads a float32 or float64 scalar value.
func scalar(v any) (float64, error) {
	if d, ok := v.(*tensor.Dense); ok {
		v = d.Data()
	}
	switch x := v.(type) {
	case float32:
		return float64(x), nil
	case float64:
		return x, nil
	case *G.F32:
		return float64(*x), nil
	case *G.F64:
		return float64(*x), nil
	case []float32:
		if len(x) == 1 {
			return float64(x[0]), nil
		}
	case []float64:
		if len(x) == 1 {
			return x[0], nil
		}
	}
	return 0, fmt.Errorf("custom_model: %T is not a float scalar", v)
}

// meanOverRanks averages each of vs over the ranks.
func meanOverRanks(ctx context.Context, pg *comm.ProcessGroup, vs ...float64) ([]float64, error) {
	t := tensor.New(tensor.WithShape(len(vs)), tensor.WithBacking(append([]float64(nil), vs...)))
	if err := pg.AllReduce(ctx, t, comm.Sum).Wait(ctx); err != nil {
		return nil, err
	}
	out := t.Float64s()
	for i := range out {
		out[i] /= float64(pg.Size())
	}
	return out, nil
}

func countParams(m models.Module) int {
	n := 0
	for _, p := range m.Params() {
		n += p.Value.Shape().TotalSize()
	}
	return n
}

func paramNames(m models.Module) string {
	var s []string
	for _, p := range models.StateDict(m) {
		s = append(s, p.Name)
	}
	return strings.Join(s, ", ")
}
