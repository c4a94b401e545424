package main

// `tandem bench rpc`: RPC latency and throughput between two workers on
// loopback, comparable with peers/torch_rpc.py (PyTorch's
// TensorPipe agent): echo round trips of float32 tensors, async calls per
// second with many in flight, and Remote + ToHere. By default the callee is
// a second process (this binary in a hidden callee mode); -inproc runs both
// agents in this process. Every timed case reports its p50 and p99 (the
// median alone hides a slow mode that strikes one call in ten).
// With -peer (or -torch) it runs torch_rpc.py in turns with Tandem over
// -rounds and prints the ratios (bench_peer.go). With -bound it also times,
// after the RPC cases of each run, a bare pair of processes making the
// pushed echo's copies and nothing else (bench_rpc_bound_linux.go): the
// bound the echo is measured against, in the same command.
//
// Echo runs two ways. "echo" is the plain loop: every reply and every
// argument the callee receives gets memory of its own, which the garbage
// collector hands back for reuse some calls later. "echo_reuse" is the
// loop written for speed: the caller lends the previous result for the next
// (rpc.WithResultInto) and the callee's function is registered with
// rpc.ReuseArgMemory, so both sides copy into memory used a moment ago.
//
// Each worker process runs on one core (GOMAXPROCS=1; -cores sets it), as
// the DDP bench's ranks do and as two processes on a two-core machine are
// best run: with two Ps each, a collection in one process keeps a P busy
// while the other process copies, and the plain 4 MiB echo's p99 was 1.5 to
// 2.5 times higher (1000 calls a run), the async rate 35% lower.

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/tandemml/tandem/comm/store"
	"github.com/tandemml/tandem/internal/bytesize"
	"github.com/tandemml/tandem/launch"
	"github.com/tandemml/tandem/rpc"
	"github.com/tandemml/tandem/rref"
	"gorgonia.org/tensor"
)

func init() {
	benches["rpc"] = command{
		summary: "RPC echo latency (p50, p99), async calls/s, remote+to_here: tandem bench rpc [-json] [-min 4] [-max 16M] [-inflight 64] [-inproc] [-peer [-rounds 3]]",
		run:     func(ctx context.Context, args []string) error { return benchRPC(ctx, args, os.Stdout) },
	}
}

// rpcBenchResult is one line of `tandem bench rpc -json`.
type rpcBenchResult struct {
	Bench     string  `json:"bench"`
	Case      string  `json:"case"`
	Bytes     int     `json:"bytes,omitempty"`
	Iters     int     `json:"iters,omitempty"`
	MedianS   float64 `json:"median_s,omitempty"` // the p50, under its old name
	P50S      float64 `json:"p50_s,omitempty"`
	P99S      float64 `json:"p99_s,omitempty"`
	GBps      float64 `json:"GBps,omitempty"`
	CallsPerS float64 `json:"calls_per_s,omitempty"`
	InFlight  int     `json:"in_flight,omitempty"`
	Processes int     `json:"processes"`
	// GOMAXPROCS of each worker process (0: the runtime's default).
	GOMAXPROCS int `json:"gomaxprocs,omitempty"`
	// SameHostCopies: large tensors went by process_vm_readv, not the socket.
	SameHostCopies bool `json:"same_host_copies"`
}

type rpcBenchConfig struct {
	sizes    []int // echo sizes in bytes
	inflight int
	calls    int
	remotes  int
	iters    int
	// sameHostCopy: let large tensors go by process_vm_readv.
	sameHostCopy bool
	// poll: how long read loops poll before they park (rpc.WithPoll).
	poll time.Duration
	// push: let senders write part of large tensors themselves (rpc.WithPush).
	push bool
	// cores: GOMAXPROCS of each worker process (0: the runtime's default).
	cores int
	// callee starts the callee process (nil: this binary, as `tandem bench
	// rpc -callee`; tests pass a launcher of their own).
	callee workerLauncher
	// bound: also time the bare pair (rpcBound) for the echo sizes from
	// boundFrom, with boundPeer starting its second process (nil: this
	// binary, as `tandem bench rpc -bound-peer`).
	bound     bool
	boundPeer workerLauncher
}

const (
	rpcEcho      = "bench.echo"
	rpcEchoReuse = "bench.echo_reuse"
)

func benchRPC(ctx context.Context, args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("tandem bench rpc", flag.ContinueOnError)
	asJSON := fs.Bool("json", false, "print one JSON object per result")
	maxFlag := fs.String("max", "16M", "largest echo `size` in bytes (sizes are 4, 16, 64, ... up to it; suffixes K, M)")
	minFlag := fs.String("min", "4", "smallest echo `size` in bytes (a power of 4 times 4)")
	inflight := fs.Int("inflight", 64, "async calls kept in flight")
	calls := fs.Int("calls", 20000, "async calls in total")
	remotes := fs.Int("remotes", 200, "timed Remote + ToHere pairs")
	iters := fs.Int("iters", 0, "timed echo round trips per size (0: from 1000 for small tensors down to 200)")
	inproc := fs.Bool("inproc", false, "run both workers in this process (default: the callee is a second process)")
	noCMA := fs.Bool("no-same-host-copy", false, "send large tensors through the socket even between processes on one host")
	poll := fs.Duration("poll", rpc.DefaultPoll, "how long a read loop polls for the next frame before it parks (0: park at once)")
	noPush := fs.Bool("no-push", false, "let the receiver copy every large tensor alone, without the sender writing part of it (rpc.WithPush(false))")
	cores := fs.Int("cores", 1, "GOMAXPROCS of each worker process (0: the Go runtime's default; with -inproc the one process gets twice this)")
	peer := addPeerFlags(fs, "torch_rpc.py", 3)
	torch := fs.Bool("torch", false, "the same as -peer")
	bound := fs.Bool("bound", false, "also time, after the RPC cases, a bare pair of processes that hand each echo size of 1 MiB or more back and forth with the copies alone (half each way with process_vm_readv, half with process_vm_writev, flags in shared memory, no parking): this machine's bound for the echo")
	callee := fs.Bool("callee", false, "internal: run as the callee (rank 1, from the environment)")
	boundPeer := fs.String("bound-peer", "", "internal: run as the second process of -bound, with the flags at this `path`")
	if err := parseBenchFlags(fs, joinPeerPath(args)); err != nil {
		return err
	}
	if *callee {
		return rpcBenchCallee(ctx, !*noCMA, *poll, !*noPush)
	}
	if *boundPeer != "" {
		return rpcBoundPeer(ctx, *boundPeer)
	}
	peer.peer.on = peer.peer.on || *torch
	maxBytes, err := parseByteSize(*maxFlag)
	if err != nil {
		return fmt.Errorf("-max: %w", err)
	}
	minBytes, err := parseByteSize(*minFlag)
	if err != nil {
		return fmt.Errorf("-min: %w", err)
	}
	if *inflight < 1 || *calls < 1 || *remotes < 1 || *iters < 0 || *cores < 0 {
		return fmt.Errorf("-inflight, -calls and -remotes must be positive, -iters and -cores not negative")
	}
	cfg := rpcBenchConfig{inflight: *inflight, calls: *calls, remotes: *remotes, iters: *iters, sameHostCopy: !*noCMA, poll: *poll, push: !*noPush, cores: *cores, bound: *bound}
	for b := 4; b <= maxBytes; b *= 4 {
		if b >= minBytes {
			cfg.sizes = append(cfg.sizes, b)
		}
	}
	if peer.peer.on {
		if *inproc {
			return errors.New("-peer: torch_rpc.py runs its workers in two processes; compare without -inproc")
		}
		return rpcBenchComparePeer(ctx, cfg, *inproc, peer, stdout, *asJSON)
	}
	results, err := rpcBenchRun(ctx, cfg, *inproc)
	if err != nil {
		return err
	}
	procs := 2
	if *inproc {
		procs = 1
	}
	if !*asJSON {
		how := "inline over TCP"
		if len(results) > 0 && results[0].SameHostCopies {
			how = "same-host copies (process_vm_readv) from 256 KiB"
		}
		fmt.Fprintf(stdout, "rpc between two workers on loopback (%s), large tensors %s; p50 and p99 of the timed calls\n", cfg.processes(*inproc), how)
	}
	for _, r := range results {
		r.Bench, r.Processes, r.GOMAXPROCS = "rpc", procs, *cores
		if *asJSON {
			line, _ := json.Marshal(r)
			fmt.Fprintln(stdout, string(line))
			continue
		}
		switch r.Case {
		case "echo", "echo_reuse", "bound":
			fmt.Fprintf(stdout, "%-10s %10d B  %5d iters  p50 %11s  p99 %11s  %8.3f GB/s\n", r.Case, r.Bytes, r.Iters, fmtSeconds(r.P50S), fmtSeconds(r.P99S), r.GBps)
		case "async":
			fmt.Fprintf(stdout, "async calls/s (%d in flight): %.0f\n", r.InFlight, r.CallsPerS)
		case "remote_to_here":
			fmt.Fprintf(stdout, "remote + to_here: p50 %s  p99 %s\n", fmtSeconds(r.P50S), fmtSeconds(r.P99S))
		}
	}
	return nil
}

func fmtSeconds(s float64) string {
	return time.Duration(s * 1e9).Round(time.Microsecond / 10).String()
}

func parseByteSize(s string) (int, error) {
	n, err := bytesize.Parse(s)
	if err != nil {
		return 0, err
	}
	if n < 4 {
		return 0, fmt.Errorf("%q is not a size of at least 4 bytes", s)
	}
	return n, nil
}

func rpcBenchRegistry() *rpc.Registry {
	reg := rpc.NewRegistry()
	echo := func(ctx context.Context, x *tensor.Dense) (*tensor.Dense, error) { return x, nil }
	rpc.Register(reg, rpcEcho, echo)
	rpc.Register(reg, rpcEchoReuse, echo, rpc.ReuseArgMemory())
	return reg
}

// processes says how the workers run, for the bench's header.
func (cfg rpcBenchConfig) processes(inproc bool) string {
	switch {
	case inproc && cfg.cores > 0:
		return fmt.Sprintf("1 process, GOMAXPROCS %d", 2*cfg.cores)
	case inproc:
		return "1 process"
	case cfg.cores > 0:
		return fmt.Sprintf("2 processes, GOMAXPROCS %d each", cfg.cores)
	default:
		return "2 processes"
	}
}

// rpcBenchRun starts the two workers, times every case on rank 0 and shuts
// both down.
func rpcBenchRun(ctx context.Context, cfg rpcBenchConfig, inproc bool) ([]rpcBenchResult, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	if cfg.cores > 0 {
		here := cfg.cores
		if inproc {
			here *= 2
		}
		defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(here))
	}
	var secret [16]byte
	rand.Read(secret[:])
	token := hex.EncodeToString(secret[:])
	st, err := store.NewTCP(ctx, "127.0.0.1:0", true, store.WithToken(token))
	if err != nil {
		return nil, err
	}
	defer st.Close()
	// The callee's end: its error (nil after a clean shutdown) is in
	// peerErr once peerExit is closed.
	peerExit := make(chan struct{})
	var peerErr error
	if inproc {
		go func() {
			defer close(peerExit)
			a, err := rpc.Init(ctx, "w1", 1, 2, rpc.WithStore(st), rpc.WithRegistry(rpcBenchRegistry()), rpc.WithExtensions(rref.Extension()), rpc.WithToken(token), rpc.WithSameHostCopy(cfg.sameHostCopy), rpc.WithPoll(cfg.poll), rpc.WithPush(cfg.push))
			if err == nil {
				err = a.Shutdown(ctx)
			}
			peerErr = err
		}()
	} else {
		_, port, _ := net.SplitHostPort(st.Addr())
		portNum, _ := strconv.Atoi(port)
		peer := launch.Job{
			Launcher: launch.TandemRun, Rank: 1, WorldSize: 2, LocalRank: 1, LocalWorldSize: 2, NodeRank: 0, NumNodes: 1,
			MasterAddr: "127.0.0.1", MasterPort: portNum, MaxRestarts: 0, Token: token,
		}
		env := peer.Environ()
		if cfg.cores > 0 {
			env = append(env, "GOMAXPROCS="+strconv.Itoa(cfg.cores))
		}
		start := cfg.callee
		if start == nil {
			start = selfLauncher("rpc")
		}
		cmd, err := start([]string{"-callee", "-no-same-host-copy=" + strconv.FormatBool(!cfg.sameHostCopy), "-poll=" + cfg.poll.String(), "-no-push=" + strconv.FormatBool(!cfg.push)}, nil)
		if err != nil {
			return nil, fmt.Errorf("starting the peer: %w", err)
		}
		cmd.Env = launch.Overlay(cmd.Env, env)
		cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
		if err := cmd.Start(); err != nil {
			return nil, fmt.Errorf("starting the peer: %w", err)
		}
		go func() {
			defer close(peerExit)
			peerErr = cmd.Wait()
		}()
		go func() {
			// The run ending first (an error, or the caller's context)
			// takes the callee down with it.
			select {
			case <-ctx.Done():
				cmd.Process.Kill()
			case <-peerExit:
			}
		}()
	}
	a, err := rpc.Init(ctx, "w0", 0, 2, rpc.WithStore(st), rpc.WithRegistry(rpcBenchRegistry()), rpc.WithExtensions(rref.Extension()), rpc.WithToken(token), rpc.WithSameHostCopy(cfg.sameHostCopy), rpc.WithPoll(cfg.poll), rpc.WithPush(cfg.push))
	if err != nil {
		cancel()
		<-peerExit
		return nil, err
	}
	// The callee serves until this side shuts down: if it ends before the
	// cases do, they stop at once with that as the cause, rather than each
	// call redialling a worker that is gone for the agent's timeout.
	casesCtx, stopCases := context.WithCancelCause(ctx)
	casesDone := make(chan struct{})
	go func() {
		select {
		case <-peerExit:
			stopCases(calleeExited(peerErr))
		case <-casesDone:
		}
	}()
	results, runErr := rpcBenchCases(casesCtx, a, cfg)
	close(casesDone)
	if runErr == nil {
		runErr = context.Cause(casesCtx) // nil unless the callee ended
	}
	stopCases(nil)
	if runErr == nil {
		for i := range results {
			results[i].SameHostCopies = a.Metrics().SameHostCopies > 0
		}
	}
	if runErr != nil {
		a.Close()
		cancel()
		<-peerExit
		if cause := context.Cause(casesCtx); errors.Is(cause, errCalleeExited) {
			return nil, cause
		}
		return nil, runErr
	}
	if err := a.Shutdown(ctx); err != nil {
		return nil, err
	}
	<-peerExit
	if peerErr != nil {
		return nil, fmt.Errorf("peer: %w", peerErr)
	}
	if cfg.bound {
		bounds, err := rpcBoundCases(ctx, cfg)
		if err != nil {
			return nil, err
		}
		results = append(results, bounds...)
	}
	return results, nil
}

// boundFrom is the smallest echo size the bound is timed for: the pushed
// sizes, whose copies the bound makes.
const boundFrom = 1 << 20

// rpcBoundCases times the bare pair (rpcBound) for each echo size from
// boundFrom, as many round trips as the echo makes, after as many warm-up
// ones.
func rpcBoundCases(ctx context.Context, cfg rpcBenchConfig) ([]rpcBenchResult, error) {
	start := cfg.boundPeer
	if start == nil {
		start = selfLauncher("rpc")
	}
	var out []rpcBenchResult
	for _, bytes := range cfg.sizes {
		if bytes < boundFrom {
			continue
		}
		iters := cfg.iters
		if iters == 0 {
			iters = max(200, min(1000, (64<<20)/bytes))
		}
		times, err := rpcBound(ctx, start, bytes, echoWarmup, iters, cfg.cores)
		if err != nil {
			return nil, fmt.Errorf("-bound, %d bytes: %w", bytes, err)
		}
		p50 := quantile(times, 0.5).Seconds()
		out = append(out, rpcBenchResult{Case: "bound", Bytes: bytes, Iters: iters, MedianS: p50, P50S: p50,
			P99S: quantile(times, 0.99).Seconds(), GBps: 2 * float64(bytes) / p50 / 1e9})
	}
	return out, nil
}

// errCalleeExited marks a bench run whose callee ended before the caller
// shut the two down.
var errCalleeExited = errors.New("the callee ended before the run did")

// calleeExited says how the callee ended, wrapping errCalleeExited.
func calleeExited(err error) error {
	if err == nil {
		return fmt.Errorf("tandem bench rpc: %w (it exited cleanly; its messages are above)", errCalleeExited)
	}
	return fmt.Errorf("tandem bench rpc: %w: %v (its messages are above)", errCalleeExited, err)
}

// rpcBenchCallee is the callee process: it serves until the caller shuts the
// group down.
func rpcBenchCallee(ctx context.Context, sameHostCopy bool, poll time.Duration, push bool) error {
	a, err := rpc.InitFromEnv(ctx, "w1", rpc.WithRegistry(rpcBenchRegistry()), rpc.WithExtensions(rref.Extension()), rpc.WithSameHostCopy(sameHostCopy), rpc.WithPoll(poll), rpc.WithPush(push))
	if err != nil {
		return err
	}
	return a.Shutdown(ctx)
}

func ones32(n int) *tensor.Dense {
	x := make([]float32, n)
	for i := range x {
		x[i] = 1
	}
	return tensor.New(tensor.WithShape(n), tensor.WithBacking(x))
}

func rpcBenchCases(ctx context.Context, a *rpc.Agent, cfg rpcBenchConfig) ([]rpcBenchResult, error) {
	var out []rpcBenchResult
	for _, bytes := range cfg.sizes {
		x := ones32(bytes / 4)
		iters := cfg.iters
		if iters == 0 {
			// At least 200, so that the p99 is not simply the slowest call.
			iters = max(200, min(1000, (64<<20)/bytes))
		}
		for _, reuse := range []bool{false, true} {
			times, err := rpcBenchEcho(ctx, a, x, iters, reuse)
			if err != nil {
				return nil, err
			}
			c := "echo"
			if reuse {
				c = "echo_reuse"
			}
			p50 := quantile(times, 0.5).Seconds()
			out = append(out, rpcBenchResult{Case: c, Bytes: bytes, Iters: iters, MedianS: p50, P50S: p50,
				P99S: quantile(times, 0.99).Seconds(), GBps: 2 * float64(bytes) / p50 / 1e9})
		}
	}

	// Async: cfg.calls small calls, cfg.inflight at a time.
	x := ones32(1)
	sem := make(chan struct{}, cfg.inflight)
	var mu sync.Mutex
	var firstErr error
	t0 := time.Now()
	failed := func() bool {
		mu.Lock()
		defer mu.Unlock()
		return firstErr != nil
	}
	// acquire takes a slot for a call, or reports false once ctx ends: a
	// call whose reply never comes (its worker gone) holds its slot.
	acquire := func() bool {
		select {
		case sem <- struct{}{}:
			return true
		case <-ctx.Done():
			return false
		}
	}
	for i := 0; i < cfg.calls && !failed() && acquire(); i++ {
		rpc.Async[*tensor.Dense](ctx, a, "w1", rpcEcho, x).Then(func(_ *tensor.Dense, err error) {
			if err != nil {
				mu.Lock()
				firstErr = cmpOr(firstErr, err)
				mu.Unlock()
			}
			<-sem
		})
	}
	for i := 0; i < cfg.inflight; i++ {
		if !acquire() {
			break
		}
	}
	elapsed := time.Since(t0)
	mu.Lock()
	err := firstErr // calls still in flight when ctx ended may yet set it
	mu.Unlock()
	if err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, context.Cause(ctx)
	}
	out = append(out, rpcBenchResult{Case: "async", CallsPerS: float64(cfg.calls) / elapsed.Seconds(), InFlight: cfg.inflight})

	// Remote + ToHere of a 16-element tensor.
	x = ones32(16)
	times := make([]time.Duration, cfg.remotes)
	for i := -5; i < cfg.remotes; i++ {
		t0 := time.Now()
		ref, err := rref.Remote[*tensor.Dense](ctx, a, "w1", rpcEcho, x)
		if err != nil {
			return nil, err
		}
		if _, err := ref.ToHere(ctx); err != nil {
			return nil, err
		}
		if i >= 0 {
			times[i] = time.Since(t0)
		}
		if err := ref.Release(ctx); err != nil {
			return nil, err
		}
	}
	p50 := quantile(times, 0.5).Seconds()
	out = append(out, rpcBenchResult{Case: "remote_to_here", MedianS: p50, P50S: p50, P99S: quantile(times, 0.99).Seconds(), Iters: cfg.remotes})
	return out, nil
}

// rpcBenchEcho times iters echo round trips of x after 5 untimed ones and
// returns their times. With reuse, each call lends the last result for the
// next and calls the function that reuses its argument's memory.
// echoWarmup is how many untimed calls of each size an echo loop makes
// first, as peers/torch_rpc.py does: the first calls of a size find no
// memory of that size to reuse, and the memory a process takes fresh from
// the kernel costs several milliseconds a megabyte on the first touch on
// the development machine (a virtual machine whose host backs it lazily).
// After five calls the plain 4 MiB echo's p99 still counted those; after
// fifty it is the steady state's.
const echoWarmup = 50

func rpcBenchEcho(ctx context.Context, a *rpc.Agent, x *tensor.Dense, iters int, reuse bool) ([]time.Duration, error) {
	fn := rpcEcho
	if reuse {
		fn = rpcEchoReuse
	}
	var y *tensor.Dense
	call := func() error {
		var opts []rpc.CallOption
		if reuse {
			opts = append(opts, rpc.WithResultInto(y))
		}
		var err error
		y, err = rpc.Sync[*tensor.Dense](ctx, a, "w1", fn, x, opts...)
		return err
	}
	for i := 0; i < echoWarmup; i++ {
		if err := call(); err != nil {
			return nil, err
		}
	}
	times := make([]time.Duration, iters)
	for i := range times {
		t0 := time.Now()
		err := call()
		times[i] = time.Since(t0)
		if err != nil {
			return nil, err
		}
	}
	want, got := x.Data().([]float32), y.Data().([]float32)
	if !y.Shape().Eq(x.Shape()) || got[0] != want[0] || got[len(got)-1] != want[len(want)-1] {
		return nil, fmt.Errorf("echo of %d bytes (%s) came back changed: shape %v", 4*len(want), fn, y.Shape())
	}
	return times, nil
}

func cmpOr(a, b error) error {
	if a != nil {
		return a
	}
	return b
}

// torchRPCResults is what torch_rpc.py prints: echo medians by bytes, async
// calls per second and the remote + to_here median.
type torchRPCResults struct {
	echo         map[int]float64
	asyncPerS    float64
	remoteToHere float64
}

// parseTorchRPC reads the output of peers/torch_rpc.py.
func parseTorchRPC(r io.Reader) (torchRPCResults, error) {
	res := torchRPCResults{echo: map[int]float64{}}
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		line := sc.Text()
		fields := strings.Fields(line)
		if len(fields) == 0 || strings.HasPrefix(line, "#") {
			continue
		}
		switch {
		case strings.HasPrefix(fields[0], "bytes="):
			var b int
			var m float64
			for _, f := range fields {
				if v, ok := strings.CutPrefix(f, "bytes="); ok {
					b, _ = strconv.Atoi(v)
				}
				if v, ok := strings.CutPrefix(f, "median_s="); ok {
					m, _ = strconv.ParseFloat(v, 64)
				}
			}
			if b > 0 && m > 0 {
				res.echo[b] = m
			}
		case fields[0] == "async_calls_per_s" && len(fields) > 1:
			res.asyncPerS, _ = strconv.ParseFloat(fields[1], 64)
		case fields[0] == "remote_to_here_s" && len(fields) > 1:
			res.remoteToHere, _ = strconv.ParseFloat(fields[1], 64)
		}
	}
	if len(res.echo) == 0 || res.asyncPerS == 0 || res.remoteToHere == 0 {
		return res, errors.New("torch_rpc.py output lacks echo, async or remote_to_here results")
	}
	return res, sc.Err()
}

// torchRPCSizes are the echo sizes torch_rpc.py times, in bytes.
var torchRPCSizes = []int{4, 4 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20}

// rpcBenchComparePeer compares with TensorPipe (torch_rpc.py) in turns: the
// plain echo's p50 against TensorPipe's median for the sizes both time,
// async calls a second and remote + to_here; the echo's p99 and the
// memory-reusing echo are Tandem's figures alone.
func rpcBenchComparePeer(ctx context.Context, cfg rpcBenchConfig, inproc bool, o *peerOptions, stdout io.Writer, asJSON bool) error {
	var sizes []int
	for _, b := range cfg.sizes {
		if slices.Contains(torchRPCSizes, b) {
			sizes = append(sizes, b)
		}
	}
	if len(sizes) == 0 {
		return fmt.Errorf("-peer: -min and -max leave none of the sizes torch_rpc.py times (%v bytes)", torchRPCSizes)
	}
	cfg.sizes = sizes
	script := o.scriptPath("torch_rpc.py")
	p := peerRun{
		bench: "rpc", setup: "two workers, " + cfg.processes(inproc), script: script, rounds: *o.rounds, allow: *o.allowRefBL, probe: systemBLASProbe(),
		tandem: func(ctx context.Context) ([]peerMetric, error) {
			rs, err := rpcBenchRun(ctx, cfg, inproc)
			if err != nil {
				return nil, err
			}
			return rpcMetrics(rs), nil
		},
		peer: func(ctx context.Context) ([]peerMetric, []byte, error) {
			out, err := runPeerScript(ctx, script, func(port string) []string { return []string{port} })
			if err != nil {
				return nil, out, err
			}
			t, err := parseTorchRPC(bytes.NewReader(out))
			if err != nil {
				return nil, out, err
			}
			ms := make([]peerMetric, 0, len(t.echo)+2)
			for _, b := range torchRPCSizes {
				if m, ok := t.echo[b]; ok {
					ms = append(ms, peerMetric{Name: fmt.Sprintf("echo %d B p50", b), Unit: "s", Lower: true, Value: m})
				}
			}
			ms = append(ms, peerMetric{Name: "async calls/s", Unit: "calls/s", Value: t.asyncPerS},
				peerMetric{Name: "remote+to_here p50", Unit: "s", Lower: true, Value: t.remoteToHere})
			return ms, out, nil
		},
	}
	return p.run(ctx, stdout, asJSON)
}

// rpcMetrics turns one run's results into the metrics compared with the
// peer's (the names match those of rpcBenchComparePeer's peer side).
func rpcMetrics(rs []rpcBenchResult) []peerMetric {
	var ms, reuse []peerMetric
	for _, r := range rs {
		switch r.Case {
		case "echo":
			ms = append(ms, peerMetric{Name: fmt.Sprintf("echo %d B p50", r.Bytes), Unit: "s", Lower: true, Value: r.P50S},
				peerMetric{Name: fmt.Sprintf("echo %d B p99", r.Bytes), Unit: "s", Lower: true, Value: r.P99S})
		case "echo_reuse":
			reuse = append(reuse, peerMetric{Name: fmt.Sprintf("echo_reuse %d B p50", r.Bytes), Unit: "s", Lower: true, Value: r.P50S})
		case "bound":
			reuse = append(reuse, peerMetric{Name: fmt.Sprintf("bound %d B p50", r.Bytes), Unit: "s", Lower: true, Value: r.P50S},
				peerMetric{Name: fmt.Sprintf("bound %d B p99", r.Bytes), Unit: "s", Lower: true, Value: r.P99S})
		case "async":
			ms = append(ms, peerMetric{Name: "async calls/s", Unit: "calls/s", Value: r.CallsPerS})
		case "remote_to_here":
			ms = append(ms, peerMetric{Name: "remote+to_here p50", Unit: "s", Lower: true, Value: r.P50S})
		}
	}
	return append(ms, reuse...)
}

func freePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}
