package main

// Multi-process benchmarks (`tandem bench allreduce`, `tandem bench ddp`)
// start one worker process per rank, children of this binary in a hidden
// worker mode, give each its rank through the environment as `tandem run`
// does, and read rank 0's results: one JSON object per line on its stdout.

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"sync"

	"github.com/tandemml/tandem/launch"
)

// workerLauncher builds the command that runs one worker process of a
// benchmark (args are the worker's flags); env is added to its environment.
type workerLauncher func(args, env []string) (*exec.Cmd, error)

// workerBenchFunc is a benchmark that starts processes of this binary: it
// writes its results to stdout and starts its workers with launch (tests
// pass a launcher of their own).
type workerBenchFunc func(ctx context.Context, args []string, stdout io.Writer, launch workerLauncher) error

// addWorkerBench lists the benchmark run under `tandem bench name`, its
// workers started as `tandem bench name -worker ...` (selfLauncher).
func addWorkerBench(name, summary string, run workerBenchFunc) {
	benches[name] = command{
		summary: summary,
		run: func(ctx context.Context, args []string) error {
			return run(ctx, args, os.Stdout, selfLauncher(name))
		},
	}
}

// selfLauncher returns the launcher that re-executes this binary as
// `tandem bench <bench> args...`.
func selfLauncher(bench string) workerLauncher {
	return func(args, env []string) (*exec.Cmd, error) {
		exe, err := os.Executable()
		if err != nil {
			return nil, fmt.Errorf("finding this executable to start workers: %w", err)
		}
		cmd := exec.Command(exe, append([]string{"bench", bench}, args...)...)
		cmd.Env = append(os.Environ(), env...)
		return cmd, nil
	}
}

// runBenchWorkers runs n worker processes on this machine, all with the
// flags args and the environment env plus their rank's (RANK, WORLD_SIZE,
// LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT, TANDEM_TOKEN...:
// launch.Job.Environ of a one-node job, as tandem run sets them), and
// returns every line rank 0 printed, decoded from JSON. Their stderr goes to
// ours. When one rank fails the others are killed, as they are when ctx ends.
func runBenchWorkers[T any](ctx context.Context, n int, start workerLauncher, args, env []string) ([]T, error) {
	port, err := benchMasterPort()
	if err != nil {
		return nil, err
	}
	var secret [16]byte
	rand.Read(secret[:])
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var (
		results  []T   // written by rank 0's goroutine only, read after wg.Wait
		parseErr error // likewise
		errs     = make([]error, n)
		wg       sync.WaitGroup
	)
	for r := range n {
		job := launch.Job{
			Launcher: launch.TandemRun, Rank: r, WorldSize: n, LocalRank: r, LocalWorldSize: n,
			NodeRank: 0, NumNodes: 1, MasterAddr: "127.0.0.1", MasterPort: port,
			MaxRestarts: 0, Token: hex.EncodeToString(secret[:]),
		}
		cmd, err := start(args, launch.Overlay(env, job.Environ()))
		if err != nil {
			cancel()
			wg.Wait()
			return nil, err
		}
		cmd.Stderr = os.Stderr
		out, err := cmd.StdoutPipe()
		if err != nil {
			cancel()
			wg.Wait()
			return nil, err
		}
		if err := cmd.Start(); err != nil {
			cancel()
			wg.Wait()
			return nil, fmt.Errorf("starting rank %d: %w", r, err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			stop := context.AfterFunc(ctx, func() { cmd.Process.Kill() })
			defer stop()
			sc := bufio.NewScanner(out)
			for sc.Scan() {
				if r != 0 {
					continue
				}
				var v T
				if err := json.Unmarshal(sc.Bytes(), &v); err != nil {
					parseErr = fmt.Errorf("rank 0 printed %q: %w", sc.Text(), err)
					continue
				}
				results = append(results, v)
			}
			if err := cmd.Wait(); err != nil {
				errs[r] = fmt.Errorf("rank %d: %w", r, err)
				cancel() // one rank failed: stop the others
			}
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("benchmark workers failed (see their messages above): %w", err)
	}
	if parseErr != nil {
		return nil, parseErr
	}
	return results, nil
}

// benchMasterPort returns a port on 127.0.0.1 that was free a moment ago,
// for rank 0's store.
func benchMasterPort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("finding a free port for the store: %w", err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}
