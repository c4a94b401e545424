// Command ddp_fashion trains a small convolutional network on Fashion-MNIST
// with distributed data parallelism: every process holds a full replica of
// the model, trains on its own shard of each epoch, and the replicas average
// their gradients every step so that they stay identical. Rank 0 shows
// progress, and after every epoch the test set is scored, a safetensors
// checkpoint is written and a PNG of the curves is redrawn.
//
// Run two ranks on one machine (see README.md for the tutorial):
//
//	go build -tags openblas -o bin/ddp_fashion ./examples/ddp_fashion
//	go run -tags openblas ./cmd/tandem run -nproc 2 -- bin/ddp_fashion -epochs 5 -out out/ddp_fashion
//
// Started without a launcher it trains in a single process.
//
// Under `tandem run -metrics-addr HOST:PORT` (make demo passes
// 127.0.0.1:0) every rank serves Prometheus metrics and prints where: its
// collectives, the rendezvous store's operations, DDP's steps with their
// step, forward, backward and communication times and overlap, and the
// launcher's restarts (see package metrics).
//
// -resume continues from the newest intact checkpoint in -out, skipping
// (and naming) newer ones that are truncated or fail their checksum. A run
// whose loss, gradients or weights stop being finite stops at once on every
// rank, saying where, without saving, and exits with status 4; a missing
// data set gives status 3, other failures 1.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/signal"
	"sync/atomic"
	"syscall"

	"github.com/tandemml/tandem/comm"
	"github.com/tandemml/tandem/comm/local"
	"github.com/tandemml/tandem/comm/store"
	"github.com/tandemml/tandem/data"
	"github.com/tandemml/tandem/ddp"
	"github.com/tandemml/tandem/internal/blas"
	"github.com/tandemml/tandem/launch"
	"github.com/tandemml/tandem/metrics"
)

// Fashion-MNIST's pixel mean and standard deviation over the training set
// (pixels scaled to [0, 1]); inputs are normalised with them.
const (
	fashionMean = 0.2860
	fashionStd  = 0.3530
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "ddp_fashion:", err)
		os.Exit(exitCode(err))
	}
}

// exitCode is the exit status for a run that failed with err: 3 when the
// data set is missing, 4 when training diverged (a NaN or infinite loss,
// gradient or weight), 1 otherwise.
func exitCode(err error) int {
	var d *divergedError
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return 3
	case errors.As(err, &d):
		return exitDiverged
	}
	return 1
}

// run parses the flags, joins the job, loads the data and trains.
func run(ctx context.Context, args []string, stdout io.Writer) error {
	fl := flag.NewFlagSet("ddp_fashion", flag.ContinueOnError)
	cfg := config{EvalBatch: 500}
	fl.IntVar(&cfg.Epochs, "epochs", 5, "train until this many epochs are done")
	fl.IntVar(&cfg.Batch, "batch", 64, "examples per rank and step (the global batch is this times the number of ranks)")
	fl.Float64Var(&cfg.LR, "lr", 0, fmt.Sprintf("learning rate (default %g for sgd, %g for adam)", defaultLRSGD, defaultLRAdam))
	fl.StringVar(&cfg.Optimizer, "optim", "sgd", "optimizer: sgd (momentum 0.9) or adam")
	fl.StringVar(&cfg.Schedule, "schedule", "cosine", "learning-rate schedule, stepped per epoch: cosine (annealed to 0 over -epochs) or none")
	fl.StringVar(&cfg.Out, "out", "out/ddp_fashion", "folder for checkpoints and the plot (rank 0 writes it); empty: none")
	fl.Float64Var(&cfg.BucketMB, "bucket-mb", 0, fmt.Sprintf("cap of DDP's gradient buckets in MiB (default %d; the first bucket is capped at %d MiB or this, whichever is smaller)", ddp.DefaultBucketCapMB, ddp.DefaultFirstBucketCapMB))
	dataDir := fl.String("data", "", "folder holding the Fashion-MNIST files (default: $TANDEM_DATA, then "+data.FashionMNISTDebianDir+")")
	download := fl.Bool("download", false, "download Fashion-MNIST when it is not found")
	checkData := fl.Bool("check-data", false, "only check that Fashion-MNIST can be loaded (say how to get it if not) and exit")
	fl.BoolVar(&cfg.Resume, "resume", false, "continue from the newest intact checkpoint in -out (damaged newer ones are skipped)")
	fl.IntVar(&cfg.Limit, "limit", 0, "train on the first N training examples only (0: all 60000)")
	fl.Uint64Var(&cfg.Seed, "seed", 1, "seed of the initial weights and of the shuffling")
	fl.StringVar(&cfg.Timeline, "timeline", "", "rank 0 writes a Chrome-trace timeline of every rank's steps here (forward, backward, each bucket's all-reduce, optimizer), and a picture of it with .png for its extension")
	fl.IntVar(&cfg.TimelineFrom, "timeline-from", 100, "first step (from 0, over the run) that -timeline records; a run with fewer steps records its last ones")
	fl.IntVar(&cfg.TimelineSteps, "timeline-steps", 20, "steps that -timeline records")
	progress := fl.String("progress", "auto", "progress display: auto (a bar on a terminal, a line every -every percent otherwise), bar, lines or off")
	fl.IntVar(&cfg.ProgressEvery, "every", 10, "percent of an epoch between progress lines")
	fl.SetOutput(stdout)
	if err := fl.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil
		}
		return err
	}
	if fl.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", fl.Args())
	}
	if cfg.LR == 0 {
		cfg.LR = defaultLRSGD
		if cfg.Optimizer == "adam" {
			cfg.LR = defaultLRAdam
		}
	}
	var err error
	if cfg.Progress, err = parseProgressMode(*progress, stdout); err != nil {
		return err
	}
	if err := cfg.validate(); err != nil {
		return err
	}

	if *checkData {
		trainSet, testSet, err := loadFashion(ctx, *dataDir, *download)
		if err != nil {
			return err
		}
		fmt.Fprintf(stdout, "ddp_fashion: Fashion-MNIST found: %d training and %d test images\n", trainSet.Len(), testSet.Len())
		return nil
	}

	job, err := launch.Read(os.LookupEnv)
	if err != nil {
		return err
	}
	// Under tandem run -metrics-addr (make demo), this rank serves its
	// metrics: its collectives, the rendezvous store's operations, DDP's
	// step, forward, backward and communication times (once train has
	// made it) and the restarts.
	_, serve := launch.MetricsAddr(os.LookupEnv)
	var initOpts []comm.InitOption
	var storeOps *metrics.StoreMetrics
	if serve {
		storeOps = metrics.Store()
		initOpts = append(initOpts, comm.WithStoreOptions(store.WithObserver(storeOps)))
	}
	pg, err := joinJob(ctx, job, stdout, initOpts...)
	if err != nil {
		return err
	}
	defer pg.Close()
	if serve {
		var model liveDDP
		cfg.OnDDP = model.set
		mctx, stopMetrics := context.WithCancel(ctx)
		defer stopMetrics()
		addr, err := metrics.ServeFromEnv(mctx, metrics.Group(pg), metrics.DDP(&model), storeOps)
		if err != nil {
			return err
		}
		fmt.Fprintf(stdout, "ddp_fashion: rank %d serves metrics at http://%s%s\n", pg.Rank(), addr, metrics.Path)
	}
	note := resumeOnRestart(&cfg, job)
	if pg.Rank() == 0 {
		fmt.Fprintf(stdout, "ddp_fashion: %d rank(s), BLAS %s\n", pg.Size(), blas.Name)
		if note != "" {
			fmt.Fprintln(stdout, "ddp_fashion: "+note)
		}
	}
	trainSet, testSet, err := loadFashion(ctx, *dataDir, *download)
	if err != nil {
		return err
	}
	_, _, err = train(ctx, pg, cfg, trainSet, testSet, stdout)
	return err
}

// joinJob returns the world group: from the launcher's environment (tandem
// run, torchrun, mpirun, Slurm, Kubeflow: whatever package launch
// recognised in job), or a group of one when no launcher started this
// process.
func joinJob(ctx context.Context, job launch.Job, stdout io.Writer, opts ...comm.InitOption) (*comm.ProcessGroup, error) {
	if job.Launcher != launch.Unknown {
		return comm.InitFromEnv(ctx, opts...)
	}
	fmt.Fprintln(stdout, "ddp_fashion: no launcher environment (RANK, WORLD_SIZE); training in this process alone")
	groups, err := local.NewGroups(ctx, 1)
	if err != nil {
		return nil, err
	}
	return groups[0], nil
}

// liveDDP is the model's DDP for the metrics endpoint, which serves from
// before train makes it: its Stats are zero until then.
type liveDDP struct{ p atomic.Pointer[ddp.DDP] }

func (l *liveDDP) set(d *ddp.DDP) { l.p.Store(d) }

// Stats implements metrics.StatsSource.
func (l *liveDDP) Stats() ddp.Stats {
	if d := l.p.Load(); d != nil {
		return d.Stats()
	}
	return ddp.Stats{}
}

// restartVar names the variable that counts restarts under job's launcher.
func restartVar(l launch.Launcher) string {
	switch l {
	case launch.Torchrun:
		return "TORCHELASTIC_RESTART_COUNT"
	case launch.Slurm:
		return "SLURM_RESTART_COUNT"
	}
	return launch.RestartCountEnv
}

// resumeOnRestart turns on cfg.Resume when the launcher restarted this job
// (job.RestartCount > 0: TORCHELASTIC_RESTART_COUNT under torchrun,
// TANDEM_RESTART_COUNT under tandem run, SLURM_RESTART_COUNT under Slurm):
// the checkpoints in cfg.Out are then this run's, written before the
// failure, and a restart that started over would delete them. It returns
// what it did, for rank 0 to print, or "" on a first start.
func resumeOnRestart(cfg *config, job launch.Job) string {
	if job.RestartCount == 0 {
		return ""
	}
	what := fmt.Sprintf("restart %d (%s=%d, %s)", job.RestartCount, restartVar(job.Launcher), job.RestartCount, job.Launcher)
	switch {
	case cfg.Out == "":
		return what + ", but -out is empty: no checkpoint to resume from, starting over"
	case cfg.Resume:
		return what + ": resuming from the newest checkpoint in " + cfg.Out
	}
	cfg.Resume = true
	return what + ": resuming from the newest checkpoint in " + cfg.Out + " (as -resume would)"
}

// loadFashion loads both splits, normalised, from dir or the default places.
func loadFashion(ctx context.Context, dir string, download bool) (train, test *data.InMemory, err error) {
	opts := []data.Option{data.Normalize(fashionMean, fashionStd)}
	if dir != "" {
		opts = append(opts, data.Dir(dir))
	}
	if !download {
		opts = append(opts, data.NoDownload())
	}
	if train, err = data.FashionMNIST(ctx, "train", opts...); err != nil {
		return nil, nil, fmt.Errorf("%w\nAlternatively, pass -download to fetch the files from the canonical mirrors", err)
	}
	if test, err = data.FashionMNIST(ctx, "test", opts...); err != nil {
		return nil, nil, err
	}
	return train, test, nil
}
