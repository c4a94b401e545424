package main

// `tandem bench train`: one training step (forward, backward, SGD update) of
// an MLP on one core, the single-process work that PyTorch's peer script
// times with `torch_ddp.py 1` (world 1 runs the step without DDP). With -peer
// both run in turns over -rounds and the ratios are printed (bench_peer.go).

import (
	"context"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"runtime"
	"time"

	"gorgonia.org/tensor"

	"github.com/tandemml/tandem/graph"
	tblas "github.com/tandemml/tandem/internal/blas"
	"github.com/tandemml/tandem/models"
	"github.com/tandemml/tandem/optim"
)

func init() {
	benches["train"] = command{
		summary: "one-core MLP training step: tandem bench train [-sizes 784,1024,1024,10] [-batch 64] [-steps 50] [-sgd-in-backward] [-peer [-rounds 3]] [-json]",
		run:     benchTrain,
	}
}

// trainBenchResult is one line of `tandem bench train -json`.
type trainBenchResult struct {
	Bench       string  `json:"bench"`
	Device      string  `json:"device"` // cpu or cuda
	BLAS        string  `json:"blas"`
	BLASCore    string  `json:"blas_core"` // the kernels: "go-avx512", "go-fma", "go", or OpenBLAS's core name
	Sizes       []int   `json:"sizes"`
	Batch       int     `json:"batch"`
	SGDFused    bool    `json:"sgd_in_backward"` // the weights' SGD update ran inside the backward products
	MedianStepS float64 `json:"median_step_s"`
	StepsPerS   float64 `json:"steps_per_s"`
}

func benchTrain(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("tandem bench train", flag.ContinueOnError)
	mlp := addMLPStepFlags(fs, 50, "timed steps (after 10 warm-up steps)")
	peer := addPeerFlags(fs, "torch_ddp.py", 3)
	asJSON := fs.Bool("json", false, "print one JSON object")
	device := addDeviceFlag(fs)
	fused := fs.Bool("sgd-in-backward", false, "fuse the Linear weights' SGD update into the backward products (models.WithSGDInBackward); the biases still go through optim.SGD")
	if err := parseBenchFlags(fs, joinPeerPath(args)); err != nil {
		return err
	}
	if err := checkDevice(*device, "train"); err != nil {
		return err
	}
	sizes, err := mlp.layerSizes()
	if err != nil {
		return err
	}
	batch := *mlp.batch
	// One core, as the peer runs with torch.set_num_threads(1).
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))

	if peer.peer.on {
		if *device != "cpu" {
			return fmt.Errorf("-peer compares the CPU step with PyTorch's CPU step; leave -device at cpu")
		}
		if *mlp.sizes != defaultMLPSizes || batch != 64 {
			return fmt.Errorf("-peer: torch_ddp.py trains MLP %s at batch 64; leave -sizes and -batch alone", defaultMLPSizes)
		}
		return trainPeer(ctx, sizes, batch, *mlp.steps, *fused, peer, os.Stdout, *asJSON)
	}
	timeSteps := func(ctx context.Context, sizes []int, batch, steps int) (time.Duration, error) {
		return timeTrainSteps(ctx, sizes, batch, steps, *fused)
	}
	blasName, blasCore := tblas.Name, tblas.Core()
	if *device == "cuda" {
		if *fused {
			return fmt.Errorf("-sgd-in-backward is a graph-executor option; the CUDA step does not have it")
		}
		timeSteps, blasName, blasCore = timeTrainStepsCUDA, "cublas", "gpu0"
	}
	med, err := timeSteps(ctx, sizes, batch, *mlp.steps)
	if err != nil {
		return err
	}
	res := trainBenchResult{Bench: "train", Device: *device, BLAS: blasName, BLASCore: blasCore, Sizes: sizes, Batch: batch, SGDFused: *fused,
		MedianStepS: med.Seconds(), StepsPerS: 1 / med.Seconds()}
	if *asJSON {
		return writeJSONLine(os.Stdout, res)
	}
	where := "one core"
	if *device == "cuda" {
		where = "GPU 0"
	}
	if *fused {
		where += ", SGD in the backward products"
	}
	fmt.Printf("MLP %v, batch %d, float32, %s, BLAS %s (%s): median %.2f ms/step (%.1f steps/s)\n",
		sizes, batch, where, res.BLAS, res.BLASCore, 1e3*res.MedianStepS, res.StepsPerS)
	return nil
}

// timeTrainSteps builds the MLP step on the graph executor and returns the
// median wall time of steps timed steps after ten warm-up steps. With fused
// the weights' SGD update runs inside the backward products
// (models.WithSGDInBackward) and optim.SGD updates only the biases.
func timeTrainSteps(ctx context.Context, sizes []int, batch, steps int, fused bool) (time.Duration, error) {
	rng := rand.New(rand.NewPCG(0, 1))
	model, err := models.NewMLP(sizes, models.WithRand(rng), models.WithDtype(tensor.Float32))
	if err != nil {
		return 0, err
	}
	xs := make([]float32, batch*sizes[0])
	for i := range xs {
		xs[i] = float32(rng.NormFloat64())
	}
	ys := make([]int64, batch)
	for i := range ys {
		ys[i] = int64(rng.IntN(sizes[len(sizes)-1]))
	}
	// Gradients land in Param.Grad straight from the backward ops, which
	// overwrite them: the loop below does not clear them first, as
	// torch_ddp.py's zero_grad(set_to_none=True) does not (both loops were
	// faster so; BENCHMARKS.md, 2026-12-02).
	bopts := []models.BuilderOption{models.WithGradsInPlace()}
	const lr = 0.01
	if fused {
		bopts = append(bopts, models.WithSGDInBackward(lr))
	}
	b := models.NewBuilder(nil, bopts...)
	x := b.Bind("x", tensor.New(tensor.WithShape(batch, sizes[0]), tensor.WithBacking(xs)))
	y := b.Bind("y", tensor.New(tensor.WithShape(batch), tensor.WithBacking(ys)))
	logits, err := model.Forward(b, x)
	if err != nil {
		return 0, err
	}
	loss, err := models.CrossEntropy(logits, y)
	if err != nil {
		return 0, err
	}
	if err := b.Backward(loss); err != nil {
		return 0, err
	}
	prog, err := b.Compile(graph.Workers(1))
	if err != nil {
		return 0, err
	}
	_, rest := b.SGDInBackward() // every parameter unless fused
	opt, err := optim.NewSGD(rest, optim.LR(lr))
	if err != nil {
		return 0, err
	}
	times := make([]time.Duration, 0, steps)
	for i := 0; i < steps+10; i++ {
		t0 := time.Now()
		if err := prog.Run(ctx); err != nil {
			return 0, err
		}
		if err := b.CopyGrads(); err != nil {
			return 0, err
		}
		if err := opt.Step(); err != nil {
			return 0, err
		}
		if i >= 10 {
			times = append(times, time.Since(t0))
		}
	}
	return quantile(times, 0.5), nil
}

// trainPeer compares the step with PyTorch's world-1 step of torch_ddp.py
// (no DDP, one thread) in turns.
func trainPeer(ctx context.Context, sizes []int, batch, steps int, fused bool, o *peerOptions, stdout io.Writer, asJSON bool) error {
	script := o.scriptPath("torch_ddp.py")
	p := peerRun{
		bench: "train", script: script, rounds: *o.rounds, allow: *o.allowRefBL, probe: systemBLASProbe(),
		tandem: func(ctx context.Context) ([]peerMetric, error) {
			med, err := timeTrainSteps(ctx, sizes, batch, steps, fused)
			if err != nil {
				return nil, err
			}
			return trainMetrics(med.Seconds(), batch), nil
		},
		peer: func(ctx context.Context) ([]peerMetric, []byte, error) {
			out, err := runPeerScript(ctx, script, func(port string) []string { return []string{"1", port} })
			if err != nil {
				return nil, out, err
			}
			step, err := parseTorchDDP(out)
			if err != nil {
				return nil, out, err
			}
			return trainMetrics(step, batch), out, nil
		},
	}
	return p.run(ctx, stdout, asJSON)
}

// trainMetrics are the figures of one run: the median step and the samples
// a second it gives.
func trainMetrics(stepS float64, batch int) []peerMetric {
	return []peerMetric{
		{Name: "step", Unit: "s", Lower: true, Value: stepS},
		{Name: "samples/s", Unit: "samples/s", Value: float64(batch) / stepS},
	}
}
