package main

import (
	"context"
	"fmt"
	"io"
	"maps"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"time"

	"gorgonia.org/tensor"

	"github.com/tandemml/tandem/checkpoint"
	"github.com/tandemml/tandem/comm"
	"github.com/tandemml/tandem/data"
	"github.com/tandemml/tandem/ddp"
	"github.com/tandemml/tandem/models"
	"github.com/tandemml/tandem/optim"
)

// config is everything a training run needs besides its data and group.
type config struct {
	Epochs    int     // train until this many epochs are done
	Batch     int     // examples per rank and step
	LR        float64 // initial learning rate
	Optimizer string  // "sgd" (momentum 0.9) or "adam"
	Schedule  string  // "cosine" (annealed to 0 over Epochs) or "none"
	BucketMB  float64 // DDP's gradient bucket cap in MiB (0 = ddp's default)
	Out       string  // folder for checkpoints and the plot ("" = none)
	Resume    bool    // continue from the newest checkpoint in Out
	Limit     int     // train on the first Limit examples only (0 = all)
	Seed      uint64  // weights and shuffling
	EvalBatch int     // examples per evaluation batch

	Timeline      string // rank 0 writes the ranks' timeline here ("" = none) and its picture beside it
	TimelineFrom  int    // first step of the timeline's window (counted from 0 over the run)
	TimelineSteps int    // steps in the window

	Progress      progressMode
	ProgressEvery int              // percent between progress lines
	Now           func() time.Time // clock for the progress display (nil = time.Now)

	// OnDDP, when set, is given the model's DDP once it is made (to serve
	// its Stats as metrics).
	OnDDP func(*ddp.DDP)

	nanInput *nanInput // test aid: a NaN in one rank's batch (see nanInput)
}

// Default learning rates, measured on this example (see README.md).
const (
	defaultLRSGD  = 0.05
	defaultLRAdam = 1e-3
)

// validate refuses settings that cannot train.
func (c config) validate() error {
	if c.Timeline != "" && (c.TimelineFrom < 0 || c.TimelineSteps < 1) {
		return fmt.Errorf("need -timeline-from >= 0 and -timeline-steps >= 1 (got %d, %d)", c.TimelineFrom, c.TimelineSteps)
	}
	if c.Epochs < 1 || c.Batch < 1 || c.EvalBatch < 1 || c.Limit < 0 || !(c.LR > 0) || c.BucketMB < 0 {
		return fmt.Errorf("need -epochs >= 1, -batch >= 1, -lr > 0, -limit >= 0 and -bucket-mb >= 0 (got %d, %d, %v, %d, %v)",
			c.Epochs, c.Batch, c.LR, c.Limit, c.BucketMB)
	}
	if c.Optimizer != "sgd" && c.Optimizer != "adam" {
		return fmt.Errorf("-optim %q: want sgd or adam", c.Optimizer)
	}
	if c.Schedule != "cosine" && c.Schedule != "none" {
		return fmt.Errorf("-schedule %q: want cosine or none", c.Schedule)
	}
	return nil
}

// newScheduler returns the learning-rate schedule named by cfg, stepped
// once per epoch, or nil for a constant rate.
func newScheduler(cfg config, opt optim.Optimizer) (optim.Scheduler, error) {
	if cfg.Schedule == "cosine" {
		return optim.NewCosineAnnealingLR(opt, cfg.Epochs, 0)
	}
	return nil, nil
}

// newOptimizer builds the optimizer named by cfg over params.
func newOptimizer(cfg config, params []*models.Param) (optim.Optimizer, error) {
	switch cfg.Optimizer {
	case "sgd":
		return optim.NewSGD(params, optim.LR(cfg.LR), optim.Momentum(0.9))
	case "adam":
		return optim.NewAdam(params, optim.LR(cfg.LR))
	}
	return nil, fmt.Errorf("optimizer %q: want sgd or adam", cfg.Optimizer)
}

// newModel builds the CNN with weights drawn from seed: every rank draws the
// same ones (and DDP broadcasts rank 0's anyway).
func newModel(seed uint64) (*models.Sequential, error) {
	return models.NewCNN(models.CNNConfig{}, rand.New(rand.NewPCG(seed, 0x5eed)), models.WithDtype(tensor.Float32))
}

// train runs the whole job on this rank: build the model and optimizer,
// maybe resume, then per epoch train on this rank's shard, evaluate on the
// test set, and (rank 0) save a checkpoint and redraw the plot. Rank 0
// reports to w. It returns the statistics of every epoch done so far,
// including resumed ones, and the model.
func train(ctx context.Context, pg *comm.ProcessGroup, cfg config, trainSet, testSet data.Dataset, w io.Writer) ([]epochStats, *models.Sequential, error) {
	rank, world := pg.Rank(), pg.Size()
	if rank != 0 {
		w = io.Discard
	}
	if err := cfg.validate(); err != nil {
		return nil, nil, err
	}
	model, err := newModel(cfg.Seed)
	if err != nil {
		return nil, nil, err
	}
	opt, err := newOptimizer(cfg, model.Params())
	if err != nil {
		return nil, nil, err
	}
	sched, err := newScheduler(cfg, opt)
	if err != nil {
		return nil, nil, err
	}
	settings := runSettings{Seed: cfg.Seed, WorldSize: world, Batch: cfg.Batch, Optimizer: cfg.Optimizer,
		LR: cfg.LR, Schedule: cfg.Schedule, Epochs: cfg.Epochs, Limit: cfg.Limit}
	if cfg.Out != "" && rank == 0 {
		if err := os.MkdirAll(cfg.Out, 0o755); err != nil {
			return nil, nil, err
		}
		if !cfg.Resume {
			// A fresh run: checkpoints of an earlier run in the folder would
			// mix with this one's (and -resume would pick the wrong one).
			n, err := removeCheckpoints(cfg.Out)
			if err != nil {
				return nil, nil, err
			}
			if n > 0 {
				fmt.Fprintf(w, "removed %d checkpoint(s) of an earlier run from %s (use -resume to continue it instead)\n", n, cfg.Out)
			}
		}
	}

	start := 0
	var hist []epochStats
	lastGood := "" // the last checkpoint written or resumed from
	if cfg.Resume {
		if cfg.Out == "" {
			return nil, nil, fmt.Errorf("-resume needs -out, the folder holding the checkpoints")
		}
		r, err := resumeFrom(ctx, pg, cfg.Out, model, opt, sched, w)
		if err != nil {
			return nil, nil, err
		}
		if r == nil {
			fmt.Fprintf(w, "no intact checkpoint in %s: starting from epoch 1\n", cfg.Out)
		} else {
			start, hist, lastGood = r.Epoch, r.History, r.Path
			fmt.Fprintf(w, "resumed from %s: %d epoch(s) done\n", r.Path, r.Epoch)
			meta := settings.metadata()
			for _, k := range slices.Sorted(maps.Keys(meta)) {
				if old, ok := r.Settings[k]; ok && old != meta[k] {
					fmt.Fprintf(w, "note: %s was %s in the checkpointed run and is %s now; the run will not retrace the original exactly\n", k, old, meta[k])
				}
			}
		}
	}

	// DDP checks that every rank built the same model, copies rank 0's
	// weights to all, and from now on averages the gradients of every step
	// in buckets, overlapped with the backward pass.
	n := trainSet.Len()
	if cfg.Limit > 0 {
		n = min(n, cfg.Limit)
	}
	sampler, err := data.NewDistributedSampler(n, world, rank, data.Shuffle(cfg.Seed))
	if err != nil {
		return nil, nil, err
	}
	loader, err := data.NewLoader(trainSet, cfg.Batch, data.WithSampler(sampler), data.Prefetch(4))
	if err != nil {
		return nil, nil, err
	}
	eval, err := newEvaluator(pg, model, testSet, cfg.EvalBatch)
	if err != nil {
		return nil, nil, err
	}
	steps := (sampler.Len() + cfg.Batch - 1) / cfg.Batch
	var ddpOpts []ddp.Option
	if cfg.BucketMB > 0 {
		ddpOpts = append(ddpOpts, ddp.BucketCapMB(cfg.BucketMB))
	}
	var tl *ddp.Timeline
	if cfg.Timeline != "" {
		// A window past the end of a short run slides back to its last steps.
		total := max(cfg.Epochs-start, 0) * steps
		tl = ddp.NewTimeline(min(cfg.TimelineFrom, max(total-cfg.TimelineSteps, 0)), cfg.TimelineSteps)
		ddpOpts = append(ddpOpts, ddp.WithTimeline(tl))
	}
	net, err := ddp.New(ctx, pg, model, ddpOpts...)
	if err != nil {
		return nil, nil, err
	}
	if cfg.OnDDP != nil {
		cfg.OnDDP(net)
	}
	if start < cfg.Epochs {
		fmt.Fprintf(w, "training on %d examples (%d per rank, %d steps of %d per epoch) with %d rank(s), testing on %d\n",
			n, sampler.Len(), steps, cfg.Batch, world, testSet.Len())
	} else {
		fmt.Fprintf(w, "nothing to do: %d epoch(s) done, -epochs is %d\n", start, cfg.Epochs)
	}

	runStart := time.Now()
	params := model.Params()
	for epoch := start; epoch < cfg.Epochs; epoch++ {
		t0 := time.Now()
		lr := opt.LR()
		label := fmt.Sprintf("epoch %d/%d", epoch+1, cfg.Epochs)
		prog := newProgress(w, cfg.Progress, cfg.ProgressEvery, label, steps, cfg.Now)
		var lossSum, seen float64
		var firstBad lossAt // this rank's first non-finite loss of the epoch
		done := 0
		for batch, err := range loader.Epoch(ctx, epoch) {
			if err != nil {
				return hist, model, err
			}
			x := batch.X
			if p := cfg.nanInput; p != nil && p.Epoch == epoch+1 && p.Step == done+1 && p.Rank == rank {
				x = poison(x)
			}
			opt.ZeroGrad()
			loss, err := net.Step(ctx, x, batch.Y)
			if err != nil {
				return hist, model, fmt.Errorf("%s, step %d: %w", label, done+1, err)
			}
			if !finite(loss) && firstBad.Step == 0 {
				firstBad = lossAt{done + 1, loss}
			}
			// The averaged gradients are the same on every rank: all stop
			// here together, before the optimizer takes them in.
			if !gradsFinite(params) {
				prog.finish()
				where := fmt.Sprintf("%s, step %d", label, done+1)
				losses, err := poolLosses(ctx, pg, lossAt{done + 1, loss})
				if err != nil {
					return hist, model, fmt.Errorf("%s: the gradients are not finite, and pooling the ranks' losses failed: %w", where, err)
				}
				return hist, model, diverged(where, "the gradients averaged over the ranks hold NaN or infinite values", losses, true, cfg.Out, lastGood)
			}
			optStart := time.Now()
			if err := opt.Step(); err != nil {
				return hist, model, err
			}
			tl.Span(ddp.EventOptimizer, optStart, time.Now())
			lossSum += loss * float64(batch.Size())
			seen += float64(batch.Size())
			done++
			prog.update(done, lossSum/seen)
		}
		prog.finish()

		// The epoch's training loss over every rank's batches.
		sums := tensor.New(tensor.WithShape(2), tensor.WithBacking([]float64{lossSum, seen}))
		if world > 1 {
			if err := pg.AllReduce(ctx, sums, comm.Sum).Wait(ctx); err != nil {
				return hist, model, fmt.Errorf("combining the training loss: %w", err)
			}
		}
		trainLoss := sums.Float64s()[0] / max(sums.Float64s()[1], 1)
		if !finite(trainLoss) { // the same on every rank
			losses, err := poolLosses(ctx, pg, firstBad)
			if err != nil {
				return hist, model, fmt.Errorf("%s: the training loss is %v, and pooling the ranks' losses failed: %w", label, trainLoss, err)
			}
			return hist, model, diverged(label, fmt.Sprintf("the mean training loss is %v", trainLoss), losses, false, cfg.Out, lastGood)
		}
		res, err := eval.run(ctx)
		if err != nil {
			return hist, model, err
		}
		if !finite(res.Loss) {
			return hist, model, diverged(label, fmt.Sprintf("the test loss is %v (the training loss was %s): the weights give non-finite outputs", res.Loss, fmtLoss(trainLoss)), nil, false, cfg.Out, lastGood)
		}
		if err := checkpoint.CheckFinite(stateTensors(model, opt)); err != nil {
			return hist, model, diverged(label, fmt.Sprintf("the model or optimizer state is not finite: %v", err), nil, false, cfg.Out, lastGood)
		}
		st := epochStats{
			Epoch:     epoch + 1,
			TrainLoss: trainLoss,
			TestLoss:  res.Loss,
			TestAcc:   res.Accuracy,
			LR:        lr,
			Seconds:   time.Since(t0).Seconds(),
		}
		hist = append(hist, st)
		fmt.Fprintf(w, "%s: train loss %.4f  test loss %.4f  test accuracy %.2f%% (%d images)  lr %.3g  %.1fs\n",
			label, st.TrainLoss, st.TestLoss, 100*st.TestAcc, res.N, lr, st.Seconds)
		if sched != nil {
			sched.Step() // the next epoch's rate, saved with the checkpoint
		}
		if cfg.Out != "" {
			path := checkpointPath(cfg.Out, epoch+1)
			if rank == 0 {
				if err := saveCheckpoint(path, model, opt, sched, epoch+1, hist, settings); err != nil {
					return hist, model, err
				}
				plot := filepath.Join(cfg.Out, "curves.png")
				if err := writePlot(plot, hist); err != nil {
					return hist, model, err
				}
				fmt.Fprintf(w, "saved %s and %s\n", path, plot)
			}
			lastGood = path
		}
	}
	if tl != nil {
		pic, err := writeTimeline(ctx, pg, tl, cfg.Timeline, 10)
		if err != nil {
			return hist, model, err
		}
		if rank == 0 {
			fmt.Fprintf(w, "saved the timeline of %d step(s) in %s (chrome://tracing or ui.perfetto.dev) and its first steps in %s\n", cfg.TimelineSteps, cfg.Timeline, pic)
		}
	}
	if start < cfg.Epochs {
		fmt.Fprintf(w, "done: %d epoch(s) in %s, final test accuracy %.2f%%\n",
			cfg.Epochs-start, time.Since(runStart).Round(time.Second), 100*hist[len(hist)-1].TestAcc)
		fmt.Fprintf(w, "ddp (rank 0): %s\n", net.Stats())
	} else if cfg.Out != "" && rank == 0 && len(hist) > 0 {
		if err := writePlot(filepath.Join(cfg.Out, "curves.png"), hist); err != nil {
			return hist, model, err
		}
	}
	return hist, model, nil
}
