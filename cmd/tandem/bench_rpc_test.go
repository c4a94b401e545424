package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"os"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/tandemml/tandem/rpc"
	"github.com/tandemml/tandem/rref"
)

func TestBenchRPCInProcess(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var out bytes.Buffer
	if err := benchRPC(ctx, []string{"-json", "-inproc", "-max", "4K", "-iters", "3", "-calls", "200", "-remotes", "5"}, &out); err != nil {
		t.Fatal(err)
	}
	cases := map[string]int{}
	for _, line := range strings.Split(strings.TrimSpace(out.String()), "\n") {
		var r rpcBenchResult
		if err := json.Unmarshal([]byte(line), &r); err != nil {
			t.Fatalf("line %q: %v", line, err)
		}
		// One core a worker by default.
		if r.Bench != "rpc" || r.GOMAXPROCS != 1 {
			t.Fatalf("line %q", line)
		}
		cases[r.Case]++
		switch r.Case {
		case "echo", "echo_reuse":
			if r.Bytes < 4 || r.MedianS <= 0 {
				t.Fatalf("echo line %q", line)
			}
			// The p99 of 3 calls is the slowest one, never below the p50.
			if r.P50S != r.MedianS || r.P99S < r.P50S {
				t.Fatalf("echo line %q: p50 %v, p99 %v", line, r.P50S, r.P99S)
			}
		case "async":
			if r.CallsPerS <= 0 {
				t.Fatalf("async line %q", line)
			}
		case "remote_to_here":
			if r.MedianS <= 0 || r.P50S != r.MedianS || r.P99S < r.P50S {
				t.Fatalf("remote line %q", line)
			}
		}
	}
	// 4, 16, 64, 256, 1K, 4K
	if cases["echo"] != 6 || cases["echo_reuse"] != 6 || cases["async"] != 1 || cases["remote_to_here"] != 1 {
		t.Fatalf("cases: %v\n%s", cases, out.String())
	}
}

// TestBenchRPCCores: -cores sets the workers' GOMAXPROCS for the run only
// (with -inproc the one process gets both workers' share), and the header
// says so; a negative count is refused.
func TestBenchRPCCores(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	before := runtime.GOMAXPROCS(0)
	var out bytes.Buffer
	if err := benchRPC(ctx, []string{"-inproc", "-cores", "3", "-max", "4", "-iters", "3", "-calls", "20", "-remotes", "5"}, &out); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "(1 process, GOMAXPROCS 6)") {
		t.Fatalf("header does not give the workers' GOMAXPROCS:\n%s", out.String())
	}
	if after := runtime.GOMAXPROCS(0); after != before {
		t.Fatalf("GOMAXPROCS %d after the bench, %d before", after, before)
	}
	err := benchRPC(ctx, []string{"-inproc", "-cores", "-1"}, io.Discard)
	if err == nil || !strings.Contains(err.Error(), "-cores") {
		t.Fatalf("-cores -1: %v", err)
	}
}

func TestParseTorchRPC(t *testing.T) {
	in := "# TensorPipe rpc_sync echo round trip\nbytes=4\tmedian_s=0.000340\tGBps=0.000\nbytes=4194304\tmedian_s=0.001960\tGBps=4.280\nasync_calls_per_s\t5500.123\nremote_to_here_s\t0.000380\n"
	r, err := parseTorchRPC(strings.NewReader(in))
	if err != nil {
		t.Fatal(err)
	}
	if r.echo[4] != 0.00034 || r.echo[4194304] != 0.00196 || r.asyncPerS != 5500.123 || r.remoteToHere != 0.00038 {
		t.Fatalf("%+v", r)
	}
	if _, err := parseTorchRPC(strings.NewReader("nothing\n")); err == nil {
		t.Fatal("empty output parsed")
	}
}

func TestParseByteSize(t *testing.T) {
	for in, want := range map[string]int{"4": 4, "1K": 1 << 10, "1M": 1 << 20, "16M": 16 << 20, "256K": 256 << 10} {
		if got, err := parseByteSize(in); err != nil || got != want {
			t.Errorf("parseByteSize(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, in := range []string{"3", "0K", "x", "-1M", ""} {
		if _, err := parseByteSize(in); err == nil {
			t.Errorf("parseByteSize(%q) accepted", in)
		}
	}
}

// TestBenchRPCPeerRefusesInProcess: TensorPipe's two workers are two
// processes, so a comparison with both agents in one process is refused.
func TestBenchRPCPeerRefusesInProcess(t *testing.T) {
	for _, flag := range []string{"-peer", "-torch"} {
		err := benchRPC(context.Background(), []string{flag, "-inproc"}, io.Discard)
		if err == nil || !strings.Contains(err.Error(), "-inproc") {
			t.Errorf("%s -inproc: %v, want a refusal", flag, err)
		}
	}
}

// TestHelperRPCCalleeThatQuits stands for a callee process that joins the
// group and then exits without shutting down, as one that crashes does.
func TestHelperRPCCalleeThatQuits(t *testing.T) {
	runAsBenchWorker(t, func(ctx context.Context, args []string) error {
		if _, err := rpc.InitFromEnv(ctx, "w1", rpc.WithRegistry(rpcBenchRegistry()), rpc.WithExtensions(rref.Extension())); err != nil {
			return err
		}
		time.Sleep(300 * time.Millisecond)
		os.Exit(3)
		return nil
	})
}

// TestBenchRPCCalleeExits: a callee that ends during the async calls
// stops the run at once, with the calls' lost peer or the callee's exit as
// the error, rather than leaving each remaining call to redial a worker
// that is gone for the agent's timeout (a million calls would take weeks).
func TestBenchRPCCalleeExits(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 45*time.Second)
	defer cancel()
	cfg := rpcBenchConfig{sizes: []int{4}, inflight: 64, calls: 1 << 20, remotes: 5, iters: 3, sameHostCopy: true, push: true, cores: 1,
		callee: testLauncher("TestHelperRPCCalleeThatQuits")}
	t0 := time.Now()
	_, err := rpcBenchRun(ctx, cfg, false)
	if !errors.Is(err, errCalleeExited) && !errors.Is(err, rpc.ErrPeerLost) {
		t.Fatalf("rpcBenchRun with a callee that exits: %v, want the callee's exit or its lost connection", err)
	}
	if d := time.Since(t0); d > 20*time.Second {
		t.Fatalf("rpcBenchRun took %v to notice the callee had gone", d)
	}
}
