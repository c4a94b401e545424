// Command pipeline_parallel is Tandem's pipeline-parallelism tutorial: a
// two-stage model, Linear-Tanh on worker "stage1" and Linear on worker
// "stage2", trained from a third worker, "driver", with distributed
// autograd and a distributed optimizer. Each batch is cut into
// micro-batches; sent asynchronously, they keep both stages busy at once,
// and the program reports the speed-up over running the micro-batches one
// after another. See README.md.
//
// One command runs it all, starting three worker processes of this same
// program, one core each (as if each stage had its own device):
//
//	go run ./examples/pipeline_parallel
//
// -inprocess runs the three workers as goroutines of one process instead
// (still over loopback sockets), and under the launcher each process is one
// worker:
//
//	go run ./cmd/tandem run -nproc 3 -- go run ./examples/pipeline_parallel
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"runtime"
	"sort"
	"strconv"
	"sync"
	"time"

	G "gorgonia.org/gorgonia"
	"gorgonia.org/tensor"

	"github.com/tandemml/tandem/autograd"
	"github.com/tandemml/tandem/comm/store"
	"github.com/tandemml/tandem/models"
	"github.com/tandemml/tandem/rpc"
	"github.com/tandemml/tandem/rref"
)

// config is the model, the data and the schedule.
type config struct {
	Batch, MicroBatches int // a batch of Batch rows, cut into MicroBatches
	In, Hidden, Out     int // Linear(In, Hidden)+Tanh | Linear(Hidden, Out)
	Steps               int // measured steps per schedule
	LR, Momentum        float64
	Seed                uint64
}

// The workers' names, by rank.
var workerNames = []string{"driver", "stage1", "stage2"}

func main() {
	cfg := config{}
	flag.IntVar(&cfg.Batch, "batch", 256, "rows per batch")
	flag.IntVar(&cfg.MicroBatches, "microbatches", 8, "micro-batches per batch")
	flag.IntVar(&cfg.In, "in", 512, "input features")
	flag.IntVar(&cfg.Hidden, "hidden", 2048, "hidden features (the output of stage 1)")
	flag.IntVar(&cfg.Out, "out", 512, "output features")
	flag.IntVar(&cfg.Steps, "steps", 3, "measured steps of each schedule")
	flag.Float64Var(&cfg.LR, "lr", 0.01, "learning rate")
	flag.Float64Var(&cfg.Momentum, "momentum", 0.9, "SGD momentum")
	flag.Uint64Var(&cfg.Seed, "seed", 1, "seed of the weights and the data")
	inProcess := flag.Bool("inprocess", false, "run the three workers as goroutines of this process")
	cores := flag.Int("cores", 1, "GOMAXPROCS of each worker process")
	timeout := flag.Duration("timeout", 10*time.Minute, "give up after this long")
	flag.Parse()
	if cfg.MicroBatches < 1 || cfg.Batch%cfg.MicroBatches != 0 {
		fmt.Fprintf(os.Stderr, "pipeline_parallel: -batch %d must be a multiple of -microbatches %d\n", cfg.Batch, cfg.MicroBatches)
		os.Exit(2)
	}
	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()
	var err error
	switch {
	case os.Getenv("RANK") != "":
		err = runWorker(ctx, cfg, os.Stdout) // started by the launcher, or by spawn
	case *inProcess:
		_, err = runInProcess(ctx, cfg, os.Stdout)
	default:
		err = spawn(ctx, *cores)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "pipeline_parallel:", err)
		os.Exit(1)
	}
}

// stageConfig builds one stage: Linear(In, Out), then Tanh if asked.
type stageConfig struct {
	In, Out int
	Tanh    bool
	Seed    uint64
}

// registry holds what the workers serve: the stages' constructor.
func registry() (*rpc.Registry, error) {
	reg := rpc.NewRegistry()
	err := autograd.RegisterModule(reg, "pipeline.stage", func(ctx context.Context, c stageConfig) (models.Module, error) {
		lin, err := models.NewLinear(c.In, c.Out, models.WithRand(rand.New(rand.NewPCG(c.Seed, 1))), models.WithDtype(tensor.Float64))
		if err != nil || !c.Tanh {
			return lin, err
		}
		act, err := models.NewActivation(models.ActTanh)
		if err != nil {
			return nil, err
		}
		return models.NewSequential(lin, act), nil
	})
	return reg, err
}

// runWorker is one worker process: rank 0 drives the training, the others
// serve their stage until the driver is done.
func runWorker(ctx context.Context, cfg config, w io.Writer) error {
	rank, err := strconv.Atoi(os.Getenv("RANK"))
	if err != nil || rank < 0 || rank >= len(workerNames) {
		return fmt.Errorf("RANK=%q: this tutorial runs with exactly 3 workers (ranks 0, 1, 2)", os.Getenv("RANK"))
	}
	reg, err := registry()
	if err != nil {
		return err
	}
	// The workers meet through a TCP store that rank 0 serves. The program
	// opens it itself (rpc.InitFromEnv could) so that rank 0 keeps serving
	// it until every worker has finished shutting down.
	addr := net.JoinHostPort(os.Getenv("MASTER_ADDR"), os.Getenv("MASTER_PORT"))
	st, err := store.NewTCP(ctx, addr, rank == 0)
	if err != nil {
		return fmt.Errorf("store at %s: %w", addr, err)
	}
	defer st.Close()
	agent, err := rpc.InitFromEnv(ctx, workerNames[rank], rpc.WithRegistry(reg), rpc.WithStore(st), rpc.WithExtensions(autograd.Extension()))
	if err != nil {
		return err
	}
	var terr error
	if rank == 0 {
		_, terr = train(ctx, agent, cfg, w)
	}
	// A graceful shutdown returns when every worker has called it and no
	// call is in flight anywhere: the stage workers wait here while the
	// driver trains.
	serr := agent.Shutdown(ctx)
	return errors.Join(terr, serr, leave(ctx, st, rank))
}

// leave tells rank 0 that this worker is done with the store; rank 0 waits
// (a few seconds at most) until all have, before its deferred Close stops
// the store.
func leave(ctx context.Context, st store.Store, rank int) error {
	if rank != 0 {
		return st.Set(ctx, "pipeline/left/"+strconv.Itoa(rank), []byte{1})
	}
	keys := make([]string, 0, len(workerNames)-1)
	for r := 1; r < len(workerNames); r++ {
		keys = append(keys, "pipeline/left/"+strconv.Itoa(r))
	}
	if err := st.Wait(ctx, keys, 10*time.Second); err != nil {
		return fmt.Errorf("waiting for the stage workers to leave: %w", err)
	}
	return nil
}

// runInProcess runs the three workers as goroutines, over loopback sockets.
func runInProcess(ctx context.Context, cfg config, w io.Writer) (*report, error) {
	reg, err := registry()
	if err != nil {
		return nil, err
	}
	agents, err := startAgents(ctx, reg)
	if err != nil {
		return nil, err
	}
	rep, terr := train(ctx, agents[0], cfg, w)
	return rep, errors.Join(terr, shutdownAll(ctx, agents))
}

func startAgents(ctx context.Context, reg *rpc.Registry) ([]*rpc.Agent, error) {
	st := store.NewMemory()
	agents := make([]*rpc.Agent, len(workerNames))
	errs := make([]error, len(workerNames))
	var wg sync.WaitGroup
	for r, name := range workerNames {
		wg.Add(1)
		go func() {
			defer wg.Done()
			agents[r], errs[r] = rpc.Init(ctx, name, r, len(workerNames), rpc.WithStore(st), rpc.WithRegistry(reg), rpc.WithListenAddr("127.0.0.1:0"), rpc.WithExtensions(autograd.Extension()))
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		for _, a := range agents {
			if a != nil {
				a.Close()
			}
		}
		return nil, err
	}
	return agents, nil
}

func shutdownAll(ctx context.Context, agents []*rpc.Agent) error {
	errs := make([]error, len(agents))
	var wg sync.WaitGroup
	for i, a := range agents {
		wg.Add(1)
		go func() { defer wg.Done(); errs[i] = a.Shutdown(ctx) }()
	}
	wg.Wait()
	return errors.Join(errs...)
}

// spawn starts the three workers as processes of this program, with the
// launcher's variables set and cores cores each, and waits for them.
func spawn(ctx context.Context, cores int) error {
	exe, err := os.Executable()
	if err != nil {
		return err
	}
	port, err := freePort()
	if err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	errs := make([]error, len(workerNames))
	var wg sync.WaitGroup
	for r := range workerNames {
		cmd := exec.CommandContext(ctx, exe, os.Args[1:]...)
		cmd.Env = append(os.Environ(), "RANK="+strconv.Itoa(r), "WORLD_SIZE="+strconv.Itoa(len(workerNames)),
			"MASTER_ADDR=127.0.0.1", "MASTER_PORT="+strconv.Itoa(port), "GOMAXPROCS="+strconv.Itoa(cores))
		cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
		if err := cmd.Start(); err != nil {
			cancel()
			wg.Wait()
			return err
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := cmd.Wait(); err != nil {
				errs[r] = fmt.Errorf("worker %s: %w", workerNames[r], err)
				cancel() // one failed: stop the others
			}
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// pipeline is the driver's view of the model: two remote stages, the loss
// computed here, and the distributed optimizer over both stages.
type pipeline struct {
	agent          *rpc.Agent
	cfg            config
	stage1, stage2 *autograd.RemoteModule
	params         []*rref.RRef[*models.Param]
	opt            *autograd.DistributedOptimizer
	loss           *autograd.Function
	xs, ts         []*tensor.Dense // the micro-batches and their targets
}

func newPipeline(ctx context.Context, a *rpc.Agent, cfg config) (*pipeline, error) {
	p := &pipeline{agent: a, cfg: cfg}
	var err error
	if p.stage1, err = autograd.NewRemoteModule(ctx, a, "stage1", "pipeline.stage", stageConfig{In: cfg.In, Out: cfg.Hidden, Tanh: true, Seed: cfg.Seed}); err != nil {
		return nil, err
	}
	if p.stage2, err = autograd.NewRemoteModule(ctx, a, "stage2", "pipeline.stage", stageConfig{In: cfg.Hidden, Out: cfg.Out, Seed: cfg.Seed + 1}); err != nil {
		p.close(ctx)
		return nil, err
	}
	for _, s := range []*autograd.RemoteModule{p.stage1, p.stage2} {
		refs, err := s.ParameterRRefs(ctx)
		if err != nil {
			p.close(ctx)
			return nil, err
		}
		p.params = append(p.params, refs...)
	}
	if p.opt, err = autograd.NewDistributedOptimizer(ctx, a, "sgd", map[string]any{"lr": cfg.LR, "momentum": cfg.Momentum}, p.params); err != nil {
		p.close(ctx)
		return nil, err
	}
	p.loss = autograd.NewFunction("mse", func(b *models.Builder, in []*G.Node) ([]*G.Node, error) {
		l, err := models.MSE(in[0], in[1])
		return []*G.Node{l}, err
	})
	p.xs, p.ts = makeData(cfg)
	return p, nil
}

// makeData draws the inputs and the targets a fixed random "teacher" map
// gives them, cut into micro-batches.
func makeData(cfg config) (xs, ts []*tensor.Dense) {
	rng := rand.New(rand.NewPCG(cfg.Seed, 99))
	teacher := make([]float64, cfg.In*cfg.Out)
	for i := range teacher {
		teacher[i] = rng.NormFloat64() / float64(cfg.In)
	}
	rows := cfg.Batch / cfg.MicroBatches
	for range cfg.MicroBatches {
		x := make([]float64, rows*cfg.In)
		for i := range x {
			x[i] = rng.NormFloat64()
		}
		t := make([]float64, rows*cfg.Out)
		for r := range rows {
			for o := range cfg.Out {
				s := 0.0
				for k := range cfg.In {
					s += x[r*cfg.In+k] * teacher[k*cfg.Out+o]
				}
				t[r*cfg.Out+o] = s
			}
		}
		xs = append(xs, tensor.New(tensor.WithShape(rows, cfg.In), tensor.WithBacking(x)))
		ts = append(ts, tensor.New(tensor.WithShape(rows, cfg.Out), tensor.WithBacking(t)))
	}
	return xs, ts
}

func (p *pipeline) close(ctx context.Context) error {
	var errs []error
	if p.opt != nil {
		errs = append(errs, p.opt.Close(ctx))
	}
	for _, r := range p.params {
		errs = append(errs, r.Release(ctx))
	}
	for _, s := range []*autograd.RemoteModule{p.stage1, p.stage2} {
		if s != nil {
			errs = append(errs, s.Close(ctx))
		}
	}
	return errors.Join(errs...)
}

// sequential runs the micro-batches one after another: each goes through
// stage 1, stage 2, the loss and its own backward pass before the next one
// starts, so only one worker computes at a time. The gradients add up in
// the context.
func (p *pipeline) sequential(ctx context.Context, c *autograd.Context) (float64, error) {
	total := 0.0
	for i, x := range p.xs {
		h, err := p.stage1.Forward(ctx, c, x)
		if err != nil {
			return 0, err
		}
		y, err := p.stage2.Forward(ctx, c, h)
		if err != nil {
			return 0, err
		}
		l, err := p.loss.Apply(ctx, c, y, p.ts[i])
		if err != nil {
			return 0, err
		}
		if err := c.Backward(ctx, l[0]); err != nil {
			return 0, err
		}
		total += l[0].Float64s()[0]
	}
	return total / float64(len(p.xs)), nil
}

// pipelined sends the micro-batches asynchronously (GPipe's schedule):
// stage 1 always has the next micro-batch queued, and each of its results
// goes on to stage 2 at once, so stage 2 works on micro-batch i while stage
// 1 works on i+1. One backward pass from all the losses then flows back
// through stage 2 and stage 1 micro-batch by micro-batch, overlapping the
// same way.
func (p *pipeline) pipelined(ctx context.Context, c *autograd.Context) (float64, error) {
	const window = 2 // micro-batches queued on stage 1
	n := len(p.xs)
	hs := make([]*rpc.Future[*tensor.Dense], n)
	ys := make([]*rpc.Future[*tensor.Dense], n)
	for i := 0; i < min(window, n); i++ {
		hs[i] = p.stage1.ForwardAsync(ctx, c, p.xs[i])
	}
	for i := range n {
		h, err := hs[i].Wait(ctx)
		if err != nil {
			return 0, err
		}
		if j := i + window; j < n {
			hs[j] = p.stage1.ForwardAsync(ctx, c, p.xs[j])
		}
		ys[i] = p.stage2.ForwardAsync(ctx, c, h)
	}
	roots := make([]*tensor.Dense, n)
	total := 0.0
	for i := range n {
		y, err := ys[i].Wait(ctx)
		if err != nil {
			return 0, err
		}
		l, err := p.loss.Apply(ctx, c, y, p.ts[i])
		if err != nil {
			return 0, err
		}
		roots[i] = l[0]
		total += l[0].Float64s()[0]
	}
	if err := c.Backward(ctx, roots...); err != nil {
		return 0, err
	}
	return total / float64(n), nil
}

// step runs one training step with the given schedule and returns the mean
// micro-batch loss (before the update), how long the step took, and each
// stage's utilization: the share of the step its worker spent computing
// (the rest is the pipeline's bubble).
func (p *pipeline) step(ctx context.Context, pipelined bool) (loss float64, took time.Duration, util [2]float64, err error) {
	before, err := p.busy(ctx)
	if err != nil {
		return 0, 0, util, err
	}
	start := time.Now()
	err = autograd.WithContext(ctx, p.agent, func(ctx context.Context, c *autograd.Context) error {
		var err error
		if pipelined {
			loss, err = p.pipelined(ctx, c)
		} else {
			loss, err = p.sequential(ctx, c)
		}
		if err != nil {
			return err
		}
		return p.opt.Step(ctx, c.ID())
	})
	took = time.Since(start)
	if err != nil {
		return 0, 0, util, err
	}
	after, err := p.busy(ctx)
	for i := range util {
		util[i] = float64(after[i]-before[i]) / float64(took)
	}
	return loss, took, util, err
}

// busy returns how long each stage has computed so far.
func (p *pipeline) busy(ctx context.Context) ([2]time.Duration, error) {
	var out [2]time.Duration
	for i, s := range []*autograd.RemoteModule{p.stage1, p.stage2} {
		st, err := s.Stats(ctx)
		if err != nil {
			return out, err
		}
		out[i] = st.Busy()
	}
	return out, nil
}

// schedule is what train measured for one schedule.
type schedule struct {
	Times  []time.Duration
	Util   [][2]float64
	Median time.Duration
}

// report is what train measured.
type report struct {
	Losses            []float64 // every step's loss, in order (warm-up first)
	Sequential, Piped schedule
	SpeedUp           float64
}

// train trains for a warm-up step and then cfg.Steps steps of each
// schedule, alternating, and prints what it measured.
func train(ctx context.Context, a *rpc.Agent, cfg config, w io.Writer) (*report, error) {
	p, err := newPipeline(ctx, a, cfg)
	if err != nil {
		return nil, err
	}
	defer p.close(context.WithoutCancel(ctx))
	rows := cfg.Batch / cfg.MicroBatches
	fmt.Fprintf(w, "pipeline: Linear(%d, %d)+Tanh on stage1 | Linear(%d, %d) on stage2 | MSE on driver (GOMAXPROCS %d here)\n",
		cfg.In, cfg.Hidden, cfg.Hidden, cfg.Out, runtime.GOMAXPROCS(0))
	fmt.Fprintf(w, "batch of %d rows in %d micro-batches of %d; SGD lr %g momentum %g\n\n", cfg.Batch, cfg.MicroBatches, rows, cfg.LR, cfg.Momentum)
	fmt.Fprintf(w, "%-5s %-11s %-10s %-9s %s\n", "step", "schedule", "loss", "time", "busy: stage1 stage2")
	rep := &report{}
	run := func(label string, pipelined bool, keep *schedule) error {
		loss, d, util, err := p.step(ctx, pipelined)
		if err != nil {
			return fmt.Errorf("%s step: %w", label, err)
		}
		rep.Losses = append(rep.Losses, loss)
		if keep != nil {
			keep.Times = append(keep.Times, d)
			keep.Util = append(keep.Util, util)
		}
		fmt.Fprintf(w, "%-5d %-11s %-10.6f %-9v %5.0f%% %5.0f%%\n", len(rep.Losses), label, loss, d.Round(time.Millisecond), 100*util[0], 100*util[1])
		return nil
	}
	if err := run("warm-up", true, nil); err != nil { // compiles the stages' programs
		return nil, err
	}
	for range cfg.Steps {
		if err := run("sequential", false, &rep.Sequential); err != nil {
			return nil, err
		}
		if err := run("pipelined", true, &rep.Piped); err != nil {
			return nil, err
		}
	}
	rep.Sequential.Median, rep.Piped.Median = median(rep.Sequential.Times), median(rep.Piped.Times)
	if rep.Piped.Median > 0 {
		rep.SpeedUp = float64(rep.Sequential.Median) / float64(rep.Piped.Median)
	}
	fmt.Fprintf(w, "\nmedian step: sequential %v, pipelined %v: speed-up %.2fx\n",
		rep.Sequential.Median.Round(time.Millisecond), rep.Piped.Median.Round(time.Millisecond), rep.SpeedUp)
	fmt.Fprintf(w, "mean stage busy time per step: sequential %s, pipelined %s\n", meanUtil(rep.Sequential.Util), meanUtil(rep.Piped.Util))
	return rep, nil
}

func meanUtil(us [][2]float64) string {
	var s [2]float64
	for _, u := range us {
		s[0] += u[0]
		s[1] += u[1]
	}
	n := float64(max(len(us), 1))
	return fmt.Sprintf("%.0f%% and %.0f%%", 100*s[0]/n, 100*s[1]/n)
}

func median(ds []time.Duration) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := append([]time.Duration(nil), ds...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	return s[len(s)/2]
}
