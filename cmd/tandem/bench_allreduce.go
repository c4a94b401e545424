package main

// `tandem bench allreduce`: all-reduce latency and bandwidth on this machine,
// over the TCP or shared-memory backend (or Init's automatic choice) with
// one real process per rank (children of this binary, started in a hidden
// worker mode) or over the local backend with goroutine ranks. Comparable with peers/torch_allreduce.py
// (PyTorch gloo): same sizes, same iteration counts, rank 0's median.

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/tandemml/tandem/comm"
	"github.com/tandemml/tandem/comm/local"
	"gorgonia.org/tensor"
)

func init() {
	addWorkerBench("allreduce", "all-reduce latency and bandwidth: tandem bench allreduce -nproc N [-backend tcp|shm|auto|local] [-dtype float32] [-sizes 4K,64K,...] [-iters K] [-json]",
		benchAllReduce)
}

// allreduceResult is one line of `tandem bench allreduce -json`.
type allreduceResult struct {
	Bench    string  `json:"bench"`
	Backend  string  `json:"backend"`
	World    int     `json:"world"`
	Dtype    string  `json:"dtype"`
	Bytes    int     `json:"bytes"`
	Iters    int     `json:"iters"`
	MedianS  float64 `json:"median_s"`
	AlgBWGBs float64 `json:"algbw_GBps"`
	BusBWGBs float64 `json:"busbw_GBps"`
}

// allreduceConfig is what the parent and every worker agree on.
type allreduceConfig struct {
	dtype string
	sizes []int
	iters int // 0: chosen per size as the PyTorch script does
	// shared: the tensors live in memory every rank maps
	// (comm.ProcessGroup.NewSharedTensor), as DDP's buckets do with
	// ddp.SharedBuckets, and all-reduce in place there.
	shared bool
	// noStaging: all-reduces on one host go through the transport, not the
	// group's staging segment (comm.WithStaging(false)).
	noStaging bool
}

var benchDtypes = map[string]tensor.Dtype{
	"float32": tensor.Float32, "float64": tensor.Float64, "int32": tensor.Int32, "int64": tensor.Int64,
}

const defaultAllreduceSizes = "4K,16K,64K,256K,1M,4M,16M,64M"

func benchAllReduce(ctx context.Context, args []string, stdout io.Writer, launch workerLauncher) error {
	fs := flag.NewFlagSet("tandem bench allreduce", flag.ContinueOnError)
	nproc := fs.Int("nproc", 2, "number of ranks")
	backend := fs.String("backend", "tcp", "`backend`: tcp, shm or auto (one process per rank; auto is Init's default choice) or local (goroutine ranks)")
	dtype := fs.String("dtype", "float32", "element type: float32, float64, int32 or int64")
	sizesFlag := fs.String("sizes", defaultAllreduceSizes, "comma-separated buffer `sizes` in bytes (suffixes K, M, G: KiB, MiB, GiB)")
	iters := fs.Int("iters", 0, "timed iterations per size (0: 200 for small buffers down to 5 for 64 MiB, as PyTorch's script)")
	asJSON := fs.Bool("json", false, "print one JSON object per size")
	shared := fs.Bool("shared", false, "all-reduce tensors in memory every rank maps (comm's shared tensors, as ddp.SharedBuckets keeps its buckets), in place; needs every rank on one host (shm, auto on one host, local)")
	noStaging := fs.Bool("no-staging", false, "on one host, all-reduce through the transport's buffers instead of the group's staging segment (comm.WithStaging(false))")
	worker := fs.Bool("worker", false, "internal: run as one rank of the benchmark (rank from the environment)")
	peer := addPeerFlags(fs, "torch_allreduce.py", 3)
	if err := parseBenchFlags(fs, joinPeerPath(args)); err != nil {
		return err
	}
	dt, ok := benchDtypes[*dtype]
	if !ok {
		return fmt.Errorf("-dtype %q: want float32, float64, int32 or int64", *dtype)
	}
	sizes, err := parseSizes(*sizesFlag, int(dt.Size()))
	if err != nil {
		return err
	}
	if *iters < 0 {
		return fmt.Errorf("-iters %d: must not be negative", *iters)
	}
	cfg := allreduceConfig{dtype: *dtype, sizes: sizes, iters: *iters, shared: *shared, noStaging: *noStaging}
	if *worker {
		return allreduceWorker(ctx, cfg, stdout)
	}
	if *nproc < 1 {
		return fmt.Errorf("-nproc %d: need at least one rank", *nproc)
	}
	if peer.peer.on {
		if *backend == "local" {
			return fmt.Errorf("-peer: gloo runs one process a rank; compare with -backend tcp, shm or auto, not local")
		}
		return allreducePeer(ctx, cfg, *nproc, *backend, launch, peer, stdout, *asJSON)
	}
	var results []allreduceResult
	switch *backend {
	case "tcp", "shm", comm.AutoBackend:
		results, err = allreduceProcesses(ctx, cfg, *nproc, *backend, launch)
	case "local":
		results, err = allreduceGoroutines(ctx, cfg, *nproc)
	default:
		return fmt.Errorf("-backend %q: want tcp, shm, auto or local", *backend)
	}
	if err != nil {
		return err
	}
	if !*asJSON {
		where := ""
		if cfg.shared {
			where = ", tensors in shared memory"
		}
		if cfg.noStaging {
			where += ", no staging"
		}
		fmt.Fprintf(stdout, "all_reduce sum, %s, world %d, backend %s%s (rank 0's median; busbw = algbw*2(n-1)/n)\n", cfg.dtype, *nproc, *backend, where)
		fmt.Fprintf(stdout, "%12s %6s %12s %12s %12s\n", "bytes", "iters", "median", "algbw GB/s", "busbw GB/s")
	}
	for _, r := range results {
		r.Bench, r.Backend, r.World, r.Dtype = "allreduce", *backend, *nproc, cfg.dtype
		if r.MedianS > 0 {
			r.AlgBWGBs = float64(r.Bytes) / r.MedianS / 1e9
			r.BusBWGBs = r.AlgBWGBs * 2 * float64(*nproc-1) / float64(*nproc)
		}
		if *asJSON {
			if err := writeJSONLine(stdout, r); err != nil {
				return err
			}
		} else {
			fmt.Fprintf(stdout, "%12d %6d %12s %12.3f %12.3f\n", r.Bytes, r.Iters,
				roundedSeconds(r.MedianS, time.Microsecond), r.AlgBWGBs, r.BusBWGBs)
		}
	}
	return nil
}

// groupOptions are the options of the benchmark's groups.
func (c allreduceConfig) groupOptions() []comm.Option {
	if c.noStaging {
		return []comm.Option{comm.WithStaging(false)}
	}
	return nil
}

// itersFor is PyTorch's script's choice: max(5, min(200, 2^24 / elements)).
func (c allreduceConfig) itersFor(bytes int) int {
	if c.iters > 0 {
		return c.iters
	}
	elems := bytes / int(benchDtypes[c.dtype].Size())
	return max(5, min(200, (1<<24)/elems))
}

// allreduceProcesses runs one worker process per rank over the named
// backend (through TANDEM_BACKEND) and returns rank 0's results.
func allreduceProcesses(ctx context.Context, cfg allreduceConfig, n int, backend string, launch workerLauncher) ([]allreduceResult, error) {
	sizes := make([]string, len(cfg.sizes))
	for i, s := range cfg.sizes {
		sizes[i] = strconv.Itoa(s)
	}
	args := []string{"-worker", "-dtype", cfg.dtype, "-sizes", strings.Join(sizes, ","), "-iters", strconv.Itoa(cfg.iters)}
	if cfg.shared {
		args = append(args, "-shared")
	}
	if cfg.noStaging {
		args = append(args, "-no-staging")
	}
	return runBenchWorkers[allreduceResult](ctx, n, launch, args, []string{comm.BackendEnv + "=" + backend})
}

// allreduceWorker is one rank: it joins the world from the environment,
// times every size and, on rank 0, prints one JSON line per size.
func allreduceWorker(ctx context.Context, cfg allreduceConfig, stdout io.Writer) error {
	pg, err := comm.InitFromEnv(ctx, comm.WithInitTimeout(time.Minute), comm.WithoutDefault(),
		comm.WithGroupOptions(cfg.groupOptions()...))
	if err != nil {
		return err
	}
	defer pg.Close()
	results, err := timeAllReduce(ctx, pg, cfg)
	if err != nil {
		return err
	}
	if pg.Rank() == 0 {
		for _, r := range results {
			if err := writeJSONLine(stdout, r); err != nil {
				return err
			}
		}
	}
	// Leave together, so that no rank closes while another still reads.
	return pg.Barrier(ctx).Wait(ctx)
}

// allreduceGoroutines runs the benchmark with goroutine ranks over the local
// backend and returns rank 0's results.
func allreduceGoroutines(ctx context.Context, cfg allreduceConfig, n int) ([]allreduceResult, error) {
	pgs, err := local.NewGroups(ctx, n, cfg.groupOptions()...)
	if err != nil {
		return nil, err
	}
	results := make([][]allreduceResult, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for r, pg := range pgs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			results[r], errs[r] = timeAllReduce(ctx, pg, cfg)
		}()
	}
	wg.Wait()
	for _, pg := range pgs {
		pg.Close()
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return results[0], nil
}

// timeAllReduce times the all-reduce of every size on one rank: three warm-up
// calls, a barrier, then itersFor(size) timed calls.
func timeAllReduce(ctx context.Context, pg *comm.ProcessGroup, cfg allreduceConfig) ([]allreduceResult, error) {
	dt := benchDtypes[cfg.dtype]
	var out []allreduceResult
	for _, size := range cfg.sizes {
		x := tensor.New(tensor.WithShape(size/int(dt.Size())), tensor.Of(dt))
		if cfg.shared {
			st, err := pg.NewSharedTensor(ctx, dt, size/int(dt.Size()))
			if err != nil {
				return nil, fmt.Errorf("-shared: %w", err)
			}
			defer st.Close()
			x = st.Tensor()
		}
		if err := x.Memset(onesOf(dt)); err != nil {
			return nil, err
		}
		for range 3 {
			if err := pg.AllReduce(ctx, x, comm.Sum).Wait(ctx); err != nil {
				return nil, fmt.Errorf("warm-up all_reduce of %d bytes: %w", size, err)
			}
		}
		if err := pg.Barrier(ctx).Wait(ctx); err != nil {
			return nil, err
		}
		iters := cfg.itersFor(size)
		times := make([]float64, iters)
		for i := range times {
			start := time.Now()
			if err := pg.AllReduce(ctx, x, comm.Sum).Wait(ctx); err != nil {
				return nil, fmt.Errorf("all_reduce of %d bytes: %w", size, err)
			}
			times[i] = time.Since(start).Seconds()
		}
		out = append(out, allreduceResult{Bytes: size, Iters: iters, MedianS: medianOf(times)})
	}
	return out, nil
}

func onesOf(dt tensor.Dtype) any {
	switch dt {
	case tensor.Float32:
		return float32(1)
	case tensor.Float64:
		return float64(1)
	case tensor.Int32:
		return int32(1)
	default:
		return int64(1)
	}
}

// allreducePeer compares the named backend (one process a rank) with gloo
// (torch_allreduce.py, TCP over loopback) in turns: for every size both time
// and bus bandwidth.
func allreducePeer(ctx context.Context, cfg allreduceConfig, n int, backend string, launch workerLauncher, o *peerOptions, stdout io.Writer, asJSON bool) error {
	if cfg.dtype != "float32" {
		return fmt.Errorf("-peer: torch_allreduce.py reduces float32, not %s", cfg.dtype)
	}
	script := o.scriptPath("torch_allreduce.py")
	p := peerRun{
		bench: "allreduce", script: script, rounds: *o.rounds, allow: *o.allowRefBL, probe: systemBLASProbe(),
		setup: fmt.Sprintf("backend %s, one process a rank; the peer: gloo over TCP loopback", backend),
		tandem: func(ctx context.Context) ([]peerMetric, error) {
			rs, err := allreduceProcesses(ctx, cfg, n, backend, launch)
			if err != nil {
				return nil, err
			}
			var ms []peerMetric
			for _, r := range rs {
				ms = append(ms, allreduceMetrics(r.Bytes, r.MedianS, n)...)
			}
			return ms, nil
		},
		peer: func(ctx context.Context) ([]peerMetric, []byte, error) {
			out, err := runPeerScript(ctx, script, func(port string) []string {
				args := []string{strconv.Itoa(n), port}
				for _, b := range cfg.sizes {
					args = append(args, strconv.Itoa(b))
				}
				return args
			})
			if err != nil {
				return nil, out, err
			}
			ms, err := parseTorchAllreduce(out, n)
			return ms, out, err
		},
	}
	return p.run(ctx, stdout, asJSON)
}

// allreduceMetrics are the figures of one size: the median time and the
// bus bandwidth it gives at world n.
func allreduceMetrics(bytes int, medianS float64, n int) []peerMetric {
	ms := []peerMetric{{Name: fmt.Sprintf("time %d B", bytes), Unit: "s", Lower: true, Value: medianS}}
	if medianS > 0 {
		ms = append(ms, peerMetric{Name: fmt.Sprintf("busbw %d B", bytes), Unit: "GB/s",
			Value: float64(bytes) / medianS / 1e9 * 2 * float64(n-1) / float64(n)})
	}
	return ms
}

// parseTorchAllreduce reads torch_allreduce.py's table: bytes, median
// seconds, algorithm and bus bandwidth, tab-separated, one size a line.
func parseTorchAllreduce(out []byte, n int) ([]peerMetric, error) {
	var ms []peerMetric
	for _, line := range strings.Split(string(out), "\n") {
		f := strings.Fields(line)
		if len(f) < 2 || strings.HasPrefix(line, "#") {
			continue
		}
		b, err1 := strconv.Atoi(f[0])
		s, err2 := strconv.ParseFloat(f[1], 64)
		if err1 != nil || err2 != nil || b <= 0 || s <= 0 {
			continue
		}
		ms = append(ms, allreduceMetrics(b, s, n)...)
	}
	if len(ms) == 0 {
		return nil, fmt.Errorf("torch_allreduce.py printed no sizes: %q", out)
	}
	return ms, nil
}
