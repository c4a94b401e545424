//go:build unix

package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"strings"
	"testing"
	"time"
)

// TestHelperDDPBenchWorker is not a test: it is one rank of the benchmark
// that TestBenchDDP starts by re-executing this test binary.
func TestHelperDDPBenchWorker(t *testing.T) {
	runAsBenchWorker(t, func(ctx context.Context, args []string) error {
		return benchDDP(ctx, args, os.Stdout, nil)
	})
}

// TestBenchDDP runs the benchmark end to end on a small model, one real
// process a rank over TCP, and checks the JSON it prints (not the timings).
func TestBenchDDP(t *testing.T) {
	launch := testLauncher("TestHelperDDPBenchWorker")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var out bytes.Buffer
	err := benchDDP(ctx, []string{"-nproc", "2", "-sizes", "12,16,4", "-batch", "4", "-steps", "6", "-warmup", "2", "-rounds", "2", "-json"}, &out, launch)
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
		if len(r.RoundStepS) != 2 || (r.MedianStepS != r.RoundStepS[0] && r.MedianStepS != r.RoundStepS[1]) || r.MedianStepS > max(r.RoundStepS[0], r.RoundStepS[1]) {
			t.Errorf("line %d: the median step %v is not the lower middle of the rounds %v", i, r.MedianStepS, r.RoundStepS)
		}
		if i == 1 && (!r.DDP || r.Buckets < 1 || r.BytesSentPerStep != (12*16+16+16*4+4)*4 || r.Overlap < 0 || r.Overlap > 1) {
			t.Errorf("world 2: %+v", r)
		}
		if i == 0 && r.DDP {
			t.Errorf("world 1 should run without DDP by default: %+v", r)
		}
	}
}
