//go:build unix

package main

import (
	"testing"
	"time"
)

// TestHelperDDPBenchWorker is not a test: it is one rank of the benchmark
// that TestBenchDDP starts by re-executing this test binary.
func TestHelperDDPBenchWorker(t *testing.T) { runAsWorkerOf(t, benchDDP) }

// TestBenchDDP runs the benchmark end to end on a small model, one real
// process a rank over TCP, and checks the JSON it prints (not the timings).
func TestBenchDDP(t *testing.T) {
	res := runWorkerBench[ddpBenchResult](t, benchDDP, "TestHelperDDPBenchWorker", 2*time.Minute,
		"-nproc", "2", "-sizes", "12,16,4", "-batch", "4", "-steps", "6", "-warmup", "2", "-rounds", "2", "-json")
	if len(res) != 2 {
		t.Fatalf("want one line per world size (1 and 2), got %+v", res)
	}
	for i, r := range res {
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
