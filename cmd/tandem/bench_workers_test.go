package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"
)

// benchWorkerArgsEnv carries a worker's flags, as JSON, to this test binary
// when it is re-executed as a worker of a benchmark.
const benchWorkerArgsEnv = "TANDEM_TEST_BENCH_WORKER_ARGS"

// testLauncher returns a launcher that re-executes this test binary running
// only the test helper (a TestHelperXxx that calls runAsBenchWorker), in
// place of the tandem binary's hidden worker mode.
func testLauncher(helper string) workerLauncher {
	return func(args, env []string) (*exec.Cmd, error) {
		enc, err := json.Marshal(args)
		if err != nil {
			return nil, err
		}
		cmd := exec.Command(os.Args[0], "-test.run=^"+helper+"$")
		cmd.Env = append(append(os.Environ(), env...), benchWorkerArgsEnv+"="+string(enc))
		return cmd, nil
	}
}

// runAsBenchWorker is the body of a test helper: in a process started by
// testLauncher it runs run with the worker's flags and exits; in the test
// binary itself it skips.
func runAsBenchWorker(t *testing.T, run func(ctx context.Context, args []string) error) {
	raw := os.Getenv(benchWorkerArgsEnv)
	if raw == "" {
		t.Skip("worker process of the benchmark tests")
	}
	var args []string
	if err := json.Unmarshal([]byte(raw), &args); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := run(ctx, args); err != nil {
		os.Stderr.WriteString(err.Error() + "\n")
		os.Exit(1)
	}
	os.Exit(0)
}

// runAsWorkerOf is the body of the test helper that stands for `tandem
// bench NAME -worker`: run as one worker of bench (see runAsBenchWorker).
func runAsWorkerOf(t *testing.T, bench workerBenchFunc) {
	runAsBenchWorker(t, func(ctx context.Context, args []string) error {
		return bench(ctx, args, os.Stdout, nil)
	})
}

// runWorkerBench runs bench with args (which ask for -json) within timeout,
// its workers started by re-executing this test binary as helper, and
// decodes each line it prints as a T.
func runWorkerBench[T any](t *testing.T, bench workerBenchFunc, helper string, timeout time.Duration, args ...string) []T {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	var out bytes.Buffer
	if err := bench(ctx, args, &out, testLauncher(helper)); err != nil {
		t.Fatal(err)
	}
	var res []T
	for _, line := range strings.Split(strings.TrimSpace(out.String()), "\n") {
		var r T
		if err := json.Unmarshal([]byte(line), &r); err != nil {
			t.Fatalf("line %q: %v", line, err)
		}
		res = append(res, r)
	}
	return res
}

// fakeWorkerReport is what the fake worker's rank 0 prints.
type fakeWorkerReport struct {
	Line       int      `json:"line"`
	Rank       string   `json:"rank"`
	World      string   `json:"world"`
	LocalRank  string   `json:"local_rank"`
	Port       string   `json:"port"`
	HasToken   bool     `json:"has_token"`
	Extra      string   `json:"extra"`
	Args       []string `json:"args"`
	OtherRanks bool     `json:"other_ranks,omitempty"`
}

// TestHelperFakeBenchWorker is not a test: it is a worker process of the
// runBenchWorkers tests. Its first flag picks what it does.
func TestHelperFakeBenchWorker(t *testing.T) {
	runAsBenchWorker(t, func(ctx context.Context, args []string) error {
		rank := os.Getenv("RANK")
		switch args[0] {
		case "report": // every rank prints two lines; only rank 0's count
			for i := range 2 {
				r := fakeWorkerReport{Line: i, Rank: rank, World: os.Getenv("WORLD_SIZE"), LocalRank: os.Getenv("LOCAL_RANK"),
					Port: os.Getenv("MASTER_PORT"), HasToken: len(os.Getenv("TANDEM_TOKEN")) == 32,
					Extra: os.Getenv("TANDEM_TEST_EXTRA"), Args: args, OtherRanks: rank != "0"}
				if err := writeJSONLine(os.Stdout, r); err != nil {
					return err
				}
			}
			return nil
		case "garbage":
			if rank == "0" {
				fmt.Println(`{"line": 0}`)
				fmt.Println("not json")
			}
			return nil
		case "fail-rank1": // rank 1 fails at once, the others wait to be killed
			if rank == "1" {
				os.Exit(3)
			}
			<-ctx.Done()
			return ctx.Err()
		}
		return fmt.Errorf("unknown mode %q", args[0])
	})
}

func TestRunBenchWorkersReportsRank0(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	res, err := runBenchWorkers[fakeWorkerReport](ctx, 3, testLauncher("TestHelperFakeBenchWorker"),
		[]string{"report", "-x", "1"}, []string{"TANDEM_TEST_EXTRA=yes"})
	if err != nil {
		t.Fatal(err)
	}
	if len(res) != 2 {
		t.Fatalf("want rank 0's two lines, got %+v", res)
	}
	for i, r := range res {
		if r.Line != i || r.Rank != "0" || r.LocalRank != "0" || r.World != "3" || !r.HasToken || r.Extra != "yes" ||
			strings.Join(r.Args, " ") != "report -x 1" || r.OtherRanks {
			t.Errorf("line %d: %+v", i, r)
		}
		if p, err := strconv.Atoi(r.Port); err != nil || p < 1 {
			t.Errorf("line %d: MASTER_PORT %q", i, r.Port)
		}
	}
}

func TestRunBenchWorkersBadOutput(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	_, err := runBenchWorkers[fakeWorkerReport](ctx, 2, testLauncher("TestHelperFakeBenchWorker"), []string{"garbage"}, nil)
	if err == nil || !strings.Contains(err.Error(), `rank 0 printed "not json"`) {
		t.Fatalf("want a parse error naming rank 0's line, got %v", err)
	}
}

func TestRunBenchWorkersOneRankFails(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	_, err := runBenchWorkers[fakeWorkerReport](ctx, 3, testLauncher("TestHelperFakeBenchWorker"), []string{"fail-rank1"}, nil)
	if err == nil || !strings.Contains(err.Error(), "rank 1: exit status 3") {
		t.Fatalf("want rank 1's failure, got %v", err)
	}
	// The waiting ranks were killed, not left to time out on their own.
	if runtime.GOOS != "windows" {
		for _, r := range []string{"rank 0: signal: killed", "rank 2: signal: killed"} {
			if !strings.Contains(err.Error(), r) {
				t.Errorf("error lacks %q: %v", r, err)
			}
		}
	}
}

func TestRunBenchWorkersLaunchError(t *testing.T) {
	boom := errors.New("no such worker")
	_, err := runBenchWorkers[fakeWorkerReport](context.Background(), 2,
		func(args, env []string) (*exec.Cmd, error) { return nil, boom }, nil, nil)
	if !errors.Is(err, boom) {
		t.Fatalf("got %v, want the launcher's error", err)
	}
}
