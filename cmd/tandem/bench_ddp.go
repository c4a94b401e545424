//go:build unix

package main

// `tandem bench ddp`: the training step of DistributedDataParallel on an MLP
// (784-1024-1024-10, float32, batch 64 a rank by default), one process per
// rank with one core each (GOMAXPROCS=1) over the default backend (shared
// memory on one host; TANDEM_BACKEND=tcp picks TCP), at world 1
// and at world N. Comparable with peers/torch_ddp.py (PyTorch
// DDP over gloo, one thread a rank): same model, batch, optimizer and step
// count; rank 0's median step time. As in that script, world 1 runs the same
// step without DDP, the baseline of the scaling efficiency.

import (
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	mrand "math/rand/v2"
	"os"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"time"

	G "gorgonia.org/gorgonia"
	"gorgonia.org/tensor"

	"github.com/tandemml/tandem/comm"
	"github.com/tandemml/tandem/ddp"
	"github.com/tandemml/tandem/graph"
	"github.com/tandemml/tandem/internal/cputime"
	"github.com/tandemml/tandem/models"
	"github.com/tandemml/tandem/optim"
)

func init() {
	addWorkerBench("ddp", "DDP training step of an MLP, one single-core process per rank over TCP: tandem bench ddp -nproc N [-batch 64] [-steps 60] [-warmup 10] [-json]",
		benchDDP)
}

// ddpBenchResult is one line of `tandem bench ddp -json`: one world size.
type ddpBenchResult struct {
	Bench             string  `json:"bench"`
	World             int     `json:"world"`
	MedianStepS       float64 `json:"median_step_s"`
	SamplesPerS       float64 `json:"samples_per_s"`
	ScalingEfficiency float64 `json:"scaling_efficiency"`
	Overlap           float64 `json:"overlap"`
	// Details, from rank 0: whether the step used DDP (world 1 does not,
	// unless -ddp1), the per-step averages of communication time, of the
	// part of it overlapped with backward and of the time waited for it
	// after backward, the buckets, the gradient bytes sent per step, and
	// the load average of the machine when the world started.
	DDP              bool    `json:"ddp"`
	CommSPerStep     float64 `json:"comm_s_per_step"`
	OverlappedSStep  float64 `json:"overlapped_s_per_step"`
	WaitSPerStep     float64 `json:"wait_s_per_step"`
	Buckets          int     `json:"buckets"`
	BytesSentPerStep int64   `json:"bytes_sent_per_step"`
	MeanStepS        float64 `json:"mean_step_s"`
	CPUSPerStep      float64 `json:"cpu_s_per_step"` // process CPU time (user+system) per timed step
	LastLoss         float64 `json:"last_loss"`
	LoadAvg          string  `json:"loadavg,omitempty"`
	// RoundStepS is the median step time of each round (the world sizes
	// take turns, round after round, so that a machine whose speed drifts
	// slows them alike); the fields above come from the median round.
	RoundStepS []float64 `json:"round_step_s,omitempty"`
}

// ddpBenchConfig is what the parent and every worker agree on.
type ddpBenchConfig struct {
	sizes    []int
	batch    int
	steps    int
	warmup   int
	capMB    float64
	ddpWorld bool   // use DDP at world 1 too
	ring     int    // comm.WithRingThreshold, -1: the group's default
	chunk    int    // comm.WithChunkSize, 0: the group's default
	profile  string // rank 0 of the largest world writes a CPU profile here
	device   string // cpu, or cuda: every rank's step on GPU 0 (models/cudamlp)
	shared   bool   // ddp.SharedBuckets
}

// workerArgs are the flags of a worker process of this configuration.
func (c ddpBenchConfig) workerArgs() []string {
	s := make([]string, len(c.sizes))
	for i, v := range c.sizes {
		s[i] = strconv.Itoa(v)
	}
	a := []string{"-worker", "-sizes", strings.Join(s, ","), "-batch", strconv.Itoa(c.batch), "-steps", strconv.Itoa(c.steps),
		"-warmup", strconv.Itoa(c.warmup), "-bucket-cap-mb", strconv.FormatFloat(c.capMB, 'g', -1, 64)}
	if c.ddpWorld {
		a = append(a, "-ddp1")
	}
	a = append(a, "-shared-buckets="+strconv.FormatBool(c.shared))
	return append(a, "-ring-threshold", strconv.Itoa(c.ring), "-chunk-size", strconv.Itoa(c.chunk), "-cpuprofile", c.profile, "-device", c.device)
}

func benchDDP(ctx context.Context, args []string, stdout io.Writer, launch workerLauncher) error {
	fs := flag.NewFlagSet("tandem bench ddp", flag.ContinueOnError)
	nproc := fs.Int("nproc", 2, "number of ranks (world 1 runs too, as the baseline)")
	sizesFlag := fs.String("sizes", defaultMLPSizes, mlpSizesUsage)
	batch := fs.Int("batch", 64, "batch size a rank")
	steps := fs.Int("steps", 60, "training steps, warm-up included")
	warmup := fs.Int("warmup", 10, "untimed warm-up steps")
	capMB := fs.Float64("bucket-cap-mb", ddp.DefaultBucketCapMB, "DDP bucket cap in MiB")
	ddp1 := fs.Bool("ddp1", false, "run world 1 through DDP too (default: a plain step, as torch_ddp.py does)")
	shared := fs.Bool("shared-buckets", true, "keep DDP's buckets in memory every rank maps (ddp.SharedBuckets, the default); all-reduces then run in place there (ranks on one host); false keeps them private")
	ring := fs.Int("ring-threshold", -1, "all-reduces of at least this many `bytes` use the ring algorithm, smaller ones recursive doubling (-1: comm's default)")
	chunk := fs.Int("chunk-size", 0, "`bytes` per pipelined piece of a collective (0: comm's default)")
	profile := fs.String("cpuprofile", "", "write a CPU profile of rank 0's timed steps (largest world) to `file`")
	asJSON := fs.Bool("json", false, "print one JSON object per world size")
	rounds := fs.Int("rounds", 3, "rounds of every world size, taken in turns; each world reports its median round")
	worker := fs.Bool("worker", false, "internal: run as one rank (rank and world from the environment)")
	device := addDeviceFlag(fs)
	peer := addPeerFlags(fs, "torch_ddp.py", 0)
	peer.rounds = rounds
	if err := parseBenchFlags(fs, joinPeerPath(args)); err != nil {
		return err
	}
	if err := checkDevice(*device, "ddp"); err != nil {
		return err
	}
	sizes, err := parseLayerSizes(*sizesFlag)
	if err != nil {
		return err
	}
	if *batch < 1 || *steps < 1 || *warmup < 0 || *warmup >= *steps {
		return fmt.Errorf("-batch and -steps must be positive and -warmup in [0, steps)")
	}
	if !(*capMB > 0) {
		return fmt.Errorf("-bucket-cap-mb %v: must be positive", *capMB)
	}
	cfg := ddpBenchConfig{sizes: sizes, batch: *batch, steps: *steps, warmup: *warmup, capMB: *capMB, ddpWorld: *ddp1, shared: *shared, ring: *ring, chunk: *chunk, profile: *profile, device: *device}
	if *worker {
		return ddpBenchWorker(ctx, cfg, stdout)
	}
	if *nproc < 1 {
		return fmt.Errorf("-nproc %d: need at least one rank", *nproc)
	}
	if *rounds < 1 {
		return fmt.Errorf("-rounds %d: need at least one round", *rounds)
	}
	worlds := []int{1}
	if *nproc > 1 {
		worlds = append(worlds, *nproc)
	}
	if peer.peer.on {
		if *sizesFlag != defaultMLPSizes || *batch != 64 || *ddp1 {
			return fmt.Errorf("-peer: torch_ddp.py trains MLP %s at batch 64 a rank without DDP at world 1; leave -sizes, -batch and -ddp1 alone", defaultMLPSizes)
		}
		return ddpPeer(ctx, cfg, worlds, launch, peer, stdout, *asJSON)
	}
	if !*asJSON {
		fmt.Fprintf(stdout, "DDP training step, MLP %s, float32, batch %d a rank, one process and one core (GOMAXPROCS=1) a rank, backend %s; rank 0's median of %d steps after %d warm-up, median of %d rounds\n",
			*sizesFlag, *batch, envBackend(), *steps-*warmup, *warmup, *rounds)
		fmt.Fprintf(stdout, "%6s %5s %12s %12s %12s %10s %8s %12s %12s %8s %8s\n", "world", "ddp", "median step", "cpu/step", "samples/s", "scaling", "overlap", "comm/step", "wait/step", "buckets", "load")
	}
	byWorld := make([][]ddpBenchResult, len(worlds))
	for r := 0; r < *rounds; r++ {
		for i, n := range worlds {
			wcfg := cfg
			if n != worlds[len(worlds)-1] || r != *rounds-1 {
				wcfg.profile = ""
			}
			res, err := ddpBenchWorld(ctx, wcfg, n, launch)
			if err != nil {
				return fmt.Errorf("world %d: %w", n, err)
			}
			byWorld[i] = append(byWorld[i], res)
		}
	}
	var base float64
	for i, n := range worlds {
		res := medianRound(byWorld[i])
		res.Bench, res.World = "ddp", n
		if res.MedianStepS > 0 {
			res.SamplesPerS = float64(cfg.batch*n) / res.MedianStepS
		}
		if n == 1 {
			base = res.SamplesPerS
		}
		if base > 0 {
			res.ScalingEfficiency = res.SamplesPerS / (float64(n) * base)
		}
		if *asJSON {
			if err := writeJSONLine(stdout, res); err != nil {
				return err
			}
			continue
		}
		fmt.Fprintf(stdout, "%6d %5v %12s %12s %12.0f %9.1f%% %7.0f%% %12s %12s %8d %8s\n", n, res.DDP,
			secs(res.MedianStepS), secs(res.CPUSPerStep), res.SamplesPerS, 100*res.ScalingEfficiency, 100*res.Overlap,
			secs(res.CommSPerStep), secs(res.WaitSPerStep), res.Buckets, res.LoadAvg)
	}
	return nil
}

// medianRound returns the round with the median step time (the lower
// middle one for an even count), with every round's step time attached.
func medianRound(rs []ddpBenchResult) ddpBenchResult {
	sorted := slices.Clone(rs)
	slices.SortFunc(sorted, func(a, b ddpBenchResult) int { return cmp.Compare(a.MedianStepS, b.MedianStepS) })
	m := sorted[(len(sorted)-1)/2]
	m.RoundStepS = nil
	for _, r := range rs {
		m.RoundStepS = append(m.RoundStepS, r.MedianStepS)
	}
	return m
}

// secs formats a step time for the table.
func secs(s float64) string { return roundedSeconds(s, 10*time.Microsecond) }

// ddpBenchWorld runs one world of n worker processes, one core each, and
// returns rank 0's result.
func ddpBenchWorld(ctx context.Context, cfg ddpBenchConfig, n int, launch workerLauncher) (ddpBenchResult, error) {
	load := loadAvg()
	results, err := runBenchWorkers[ddpBenchResult](ctx, n, launch, cfg.workerArgs(), []string{"GOMAXPROCS=1"})
	if err != nil {
		return ddpBenchResult{}, err
	}
	if len(results) == 0 {
		return ddpBenchResult{}, errors.New("rank 0 reported nothing")
	}
	res := results[len(results)-1]
	res.LoadAvg = load
	return res, nil
}

// ddpBenchWorker is one rank: it trains cfg.steps steps and rank 0 prints
// its result as JSON.
func ddpBenchWorker(ctx context.Context, cfg ddpBenchConfig, stdout io.Writer) error {
	pg, err := comm.InitFromEnv(ctx, comm.WithInitTimeout(time.Minute), comm.WithoutDefault(),
		comm.WithGroupOptions(comm.WithRingThreshold(cfg.ring), comm.WithChunkSize(cfg.chunk)))
	if err != nil {
		return err
	}
	defer pg.Close()
	model, err := models.NewMLP(cfg.sizes, models.WithRand(mrand.New(mrand.NewPCG(0, 0))), models.WithDtype(tensor.Float32))
	if err != nil {
		return err
	}
	rng := mrand.New(mrand.NewPCG(uint64(pg.Rank()), 1))
	x := make([]float32, cfg.batch*cfg.sizes[0])
	for i := range x {
		x[i] = float32(rng.NormFloat64())
	}
	y := make([]int64, cfg.batch)
	classes := cfg.sizes[len(cfg.sizes)-1]
	for i := range y {
		y[i] = int64(rng.IntN(classes))
	}
	xt := tensor.New(tensor.WithShape(cfg.batch, cfg.sizes[0]), tensor.WithBacking(x))
	yt := tensor.New(tensor.WithShape(cfg.batch), tensor.WithBacking(y))

	useDDP := pg.Size() > 1 || cfg.ddpWorld
	var step func() (float64, error)
	var net *ddp.DDP
	optimize := true // the CPU steps leave the SGD step to opt
	if cfg.device == "cuda" {
		var done func()
		step, done, err = cudaDDPStep(ctx, pg, model, cfg.sizes, x, y, useDDP, 0.01)
		if err != nil {
			return err
		}
		defer done()
		optimize = false
	} else if useDDP {
		net, err = ddp.New(ctx, pg, model, ddp.BucketCapMB(cfg.capMB), ddp.SharedBuckets(cfg.shared))
		if err != nil {
			return err
		}
		step = func() (float64, error) { return net.Step(ctx, xt, yt) }
	} else {
		step, err = plainStep(ctx, model, xt, yt)
		if err != nil {
			return err
		}
	}
	opt, err := optim.NewSGD(model.Params(), optim.LR(0.01))
	if err != nil {
		return err
	}
	var times []float64
	var loss float64
	var cpu0 time.Duration
	for i := range cfg.steps {
		if i == cfg.warmup {
			if net != nil {
				net.ResetStats()
			}
			cpu0 = cputime.Process()
			if cfg.profile != "" && pg.Rank() == 0 {
				f, err := os.Create(cfg.profile)
				if err != nil {
					return err
				}
				defer f.Close()
				if err := pprof.StartCPUProfile(f); err != nil {
					return err
				}
				defer pprof.StopCPUProfile()
			}
		}
		t0 := time.Now()
		if loss, err = step(); err != nil {
			return err
		}
		if optimize {
			if err := opt.Step(); err != nil {
				return err
			}
		}
		if i >= cfg.warmup {
			times = append(times, time.Since(t0).Seconds())
		}
	}
	cpu := cputime.Process() - cpu0
	if pg.Size() > 1 {
		// leave together, so that no rank closes while another still reads
		if err := pg.Barrier(ctx).Wait(ctx); err != nil {
			return err
		}
	}
	if pg.Rank() != 0 {
		return nil
	}
	res := ddpBenchResult{DDP: useDDP, LastLoss: loss, CPUSPerStep: cpu.Seconds() / float64(len(times))}
	res.MedianStepS = medianOf(times)
	for _, t := range times {
		res.MeanStepS += t / float64(len(times))
	}
	if net != nil {
		st := net.Stats()
		k := float64(st.Steps)
		res.Overlap = st.Overlap()
		res.CommSPerStep = st.CommTime.Seconds() / k
		res.OverlappedSStep = st.OverlappedTime.Seconds() / k
		res.WaitSPerStep = st.WaitTime.Seconds() / k
		res.Buckets = len(st.Buckets)
		res.BytesSentPerStep = st.BytesSent / st.Steps
	}
	return writeJSONLine(stdout, res)
}

// plainStep returns a training step without DDP: the same graph, run by the
// graph executor, the gradients handed to the optimizer without a copy.
func plainStep(ctx context.Context, model models.Module, x, y *tensor.Dense) (func() (float64, error), error) {
	b := models.NewBuilder(nil)
	xn := b.Bind("x", x)
	yn := b.Bind("y", y)
	out, err := model.Forward(b, xn)
	if err != nil {
		return nil, err
	}
	loss, err := models.CrossEntropy(out, yn)
	if err != nil {
		return nil, err
	}
	if err := b.Backward(loss); err != nil {
		return nil, err
	}
	ps := b.GradParams()
	wrt := make(G.Nodes, len(ps))
	for i, p := range ps {
		if wrt[i], err = b.Node(p); err != nil {
			return nil, err
		}
	}
	prog, err := graph.Compile(b.Graph(), graph.WithGrads(wrt, b.GradNodes()))
	if err != nil {
		return nil, err
	}
	return func() (float64, error) {
		if err := prog.Run(ctx); err != nil {
			return 0, err
		}
		for i, p := range ps {
			g, err := prog.Grad(wrt[i])
			if err != nil {
				return 0, err
			}
			gd, ok := g.(*tensor.Dense)
			if !ok || gd.RequiresIterator() {
				return 0, fmt.Errorf("gradient of %s is not a plain tensor", p.Name)
			}
			p.Grad = gd
		}
		switch v := prog.Value(loss).(type) {
		case *G.F32:
			return float64(*v), nil
		case *tensor.Dense:
			return float64(v.Float32s()[0]), nil
		}
		return 0, fmt.Errorf("loss of type %T", prog.Value(loss))
	}, nil
}

// ddpPeer compares the DDP step with PyTorch's (torch_ddp.py) in turns, at
// world 1 (a plain step on both sides) and at the largest world.
func ddpPeer(ctx context.Context, cfg ddpBenchConfig, worlds []int, launch workerLauncher, o *peerOptions, stdout io.Writer, asJSON bool) error {
	script := o.scriptPath("torch_ddp.py")
	p := peerRun{
		bench: "ddp", script: script, rounds: *o.rounds, allow: *o.allowRefBL, probe: systemBLASProbe(),
		setup: "DDP over backend " + envBackend() + ", one process and one core a rank, " + bucketMemory(cfg.shared),
		tandem: func(ctx context.Context) ([]peerMetric, error) {
			var ms []peerMetric
			for _, n := range worlds {
				res, err := ddpBenchWorld(ctx, cfg, n, launch)
				if err != nil {
					return nil, fmt.Errorf("world %d: %w", n, err)
				}
				ms = append(ms, ddpMetrics(n, res.MedianStepS, cfg.batch)...)
			}
			return ms, nil
		},
		peer: func(ctx context.Context) ([]peerMetric, []byte, error) {
			var ms []peerMetric
			var all []byte
			for _, n := range worlds {
				out, err := runPeerScript(ctx, script, func(port string) []string { return []string{strconv.Itoa(n), port} })
				all = append(all, out...)
				if err != nil {
					return nil, all, err
				}
				step, err := parseTorchDDP(out)
				if err != nil {
					return nil, all, err
				}
				ms = append(ms, ddpMetrics(n, step, cfg.batch)...)
			}
			return ms, all, nil
		},
	}
	return p.run(ctx, stdout, asJSON)
}

// ddpMetrics are the figures of one world: the median step and the samples
// a second it gives, all ranks together.
func ddpMetrics(world int, stepS float64, batch int) []peerMetric {
	ms := []peerMetric{{Name: fmt.Sprintf("step world %d", world), Unit: "s", Lower: true, Value: stepS}}
	if stepS > 0 {
		ms = append(ms, peerMetric{Name: fmt.Sprintf("samples/s world %d", world), Unit: "samples/s", Value: float64(batch*world) / stepS})
	}
	return ms
}

// parseTorchDDP reads the median step time from torch_ddp.py's result line
// ("world=N median_step_s=S samples_per_s=... last_loss=...").
func parseTorchDDP(out []byte) (float64, error) {
	for _, f := range strings.Fields(string(out)) {
		if v, ok := strings.CutPrefix(f, "median_step_s="); ok {
			s, err := strconv.ParseFloat(v, 64)
			if err != nil || s <= 0 {
				return 0, fmt.Errorf("torch_ddp.py printed median_step_s=%q", v)
			}
			return s, nil
		}
	}
	return 0, fmt.Errorf("torch_ddp.py printed no median_step_s: %q", out)
}

// envBackend names the backend comm.InitFromEnv picks in the workers:
// $TANDEM_BACKEND, else comm.DefaultBackend.
func envBackend() string {
	if b := os.Getenv(comm.BackendEnv); b != "" {
		return b
	}
	return comm.DefaultBackend
}

// bucketMemory says where DDP's buckets live with ddp.SharedBuckets(shared).
func bucketMemory(shared bool) string {
	if shared {
		return "buckets in shared memory (ddp.SharedBuckets, the default; -shared-buckets=false keeps them private)"
	}
	return "buckets in private memory (-shared-buckets=false)"
}
