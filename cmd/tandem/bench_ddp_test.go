//go:build unix

package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// ddpBenchHelperEnv carries a worker's flags to the re-executed test binary.
const ddpBenchHelperEnv = "TANDEM_TEST_DDP_BENCH_ARGS"

// TestHelperDDPBenchWorker is not a test: it is one rank of the benchmark
// that TestBenchDDP starts by re-executing this test binary.
func TestHelperDDPBenchWorker(t *testing.T) {
	raw := os.Getenv(ddpBenchHelperEnv)
	if raw == "" {
		t.Skip("helper process for TestBenchDDP")
	}
	var args []string
	if err := json.Unmarshal([]byte(raw), &args); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := benchDDP(ctx, append([]string{"-worker"}, args...), os.Stdout, nil); err != nil {
		os.Stderr.WriteString(err.Error() + "\n")
		os.Exit(1)
	}
	os.Exit(0)
}

// TestBenchDDP runs the benchmark end to end on a small model, one real
// process a rank over TCP, and checks the JSON it prints (not the timings).
func TestBenchDDP(t *testing.T) {
	launch := func(args, env []string) (*exec.Cmd, error) {
		enc, err := json.Marshal(args)
		if err != nil {
			return nil, err
		}
		cmd := exec.Command(os.Args[0], "-test.run=^TestHelperDDPBenchWorker$")
		cmd.Env = append(append(os.Environ(), env...), ddpBenchHelperEnv+"="+string(enc))
		return cmd, nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var out bytes.Buffer
	err := benchDDP(ctx, []string{"-nproc", "2", "-sizes", "12,16,4", "-batch", "4", "-steps", "6", "-warmup", "2", "-json"}, &out, launch)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if len(lines) != 2 {
		t.Fatalf("want one line per world size (1 and 2), got %q", out.String())
	}
	for i, l := range lines {
		var r ddpBenchResult
		if err := json.Unmarshal([]byte(l), &r); err != nil {
			t.Fatalf("line %q: %v", l, err)
		}
		if r.Bench != "ddp" || r.World != i+1 || r.MedianStepS <= 0 || r.SamplesPerS <= 0 || r.ScalingEfficiency <= 0 {
			t.Errorf("line %d: %+v", i, r)
		}
		if i == 1 && (!r.DDP || r.Buckets < 1 || r.BytesSentPerStep != (12*16+16+16*4+4)*4 || r.Overlap < 0 || r.Overlap > 1) {
			t.Errorf("world 2: %+v", r)
		}
		if i == 0 && r.DDP {
			t.Errorf("world 1 should run without DDP by default: %+v", r)
		}
	}
}
