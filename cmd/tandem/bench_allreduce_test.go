package main

import (
	"bytes"
	"context"
	"math"
	"strings"
	"testing"
	"time"
)

// TestHelperBenchAllReduceWorker is not a test: it is the worker process that
// the benchmark tests start (in place of the tandem binary's hidden mode).
func TestHelperBenchAllReduceWorker(t *testing.T) { runAsWorkerOf(t, benchAllReduce) }

var testWorker = testLauncher("TestHelperBenchAllReduceWorker")

func runAllReduceBench(t *testing.T, args ...string) []allreduceResult {
	t.Helper()
	return runWorkerBench[allreduceResult](t, benchAllReduce, "TestHelperBenchAllReduceWorker", 2*time.Minute, args...)
}

func checkResults(t *testing.T, res []allreduceResult, backend string, world int, sizes ...int) {
	t.Helper()
	if len(res) != len(sizes) {
		t.Fatalf("got %d results, want %d: %+v", len(res), len(sizes), res)
	}
	for i, r := range res {
		if r.Bench != "allreduce" || r.Backend != backend || r.World != world || r.Dtype != "float32" || r.Bytes != sizes[i] || r.Iters != 3 {
			t.Errorf("result %d: %+v", i, r)
		}
		if r.MedianS <= 0 {
			t.Errorf("result %d: median %v", i, r.MedianS)
			continue
		}
		alg := float64(r.Bytes) / r.MedianS / 1e9
		bus := alg * 2 * float64(world-1) / float64(world)
		if math.Abs(r.AlgBWGBs-alg) > 1e-9*alg || math.Abs(r.BusBWGBs-bus) > 1e-9*alg {
			t.Errorf("result %d: algbw %v busbw %v, want %v and %v", i, r.AlgBWGBs, r.BusBWGBs, alg, bus)
		}
	}
}

func TestBenchAllReduceProcesses(t *testing.T) {
	res := runAllReduceBench(t, "-nproc", "3", "-sizes", "4K,256K", "-iters", "3", "-json")
	checkResults(t, res, "tcp", 3, 4<<10, 256<<10)
	res = runAllReduceBench(t, "-nproc", "2", "-backend", "shm", "-sizes", "4K", "-iters", "3", "-json")
	checkResults(t, res, "shm", 2, 4<<10)
	res = runAllReduceBench(t, "-nproc", "2", "-backend", "shm", "-sizes", "256K", "-iters", "3", "-json", "-no-staging")
	checkResults(t, res, "shm", 2, 256<<10)
}

func TestBenchAllReduceGoroutines(t *testing.T) {
	res := runAllReduceBench(t, "-nproc", "2", "-backend", "local", "-sizes", "64K", "-iters", "3", "-json")
	checkResults(t, res, "local", 2, 64<<10)
}

func TestBenchAllReduceTable(t *testing.T) {
	var out bytes.Buffer
	err := benchAllReduce(context.Background(), []string{"-nproc", "1", "-backend", "local", "-sizes", "4K", "-iters", "2"}, &out, testWorker)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "busbw GB/s") || !strings.Contains(out.String(), "4096") {
		t.Errorf("table output:\n%s", out.String())
	}
	out.Reset()
	err = benchAllReduce(context.Background(), []string{"-nproc", "2", "-backend", "local", "-sizes", "4K", "-iters", "2", "-no-staging"}, &out, testWorker)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "no staging") {
		t.Errorf("table output without staging:\n%s", out.String())
	}
}

func TestBenchAllReduceBadFlags(t *testing.T) {
	for _, args := range [][]string{
		{"-sizes", "4X"},
		{"-sizes", "6", "-dtype", "float32"},
		{"-dtype", "complex128"},
		{"-backend", "carrier-pigeon"},
		{"-nproc", "0"},
		{"-iters", "-1"},
	} {
		var out bytes.Buffer
		if err := benchAllReduce(context.Background(), args, &out, testWorker); err == nil {
			t.Errorf("%v: want an error", args)
		}
	}
}

func TestParseSizes(t *testing.T) {
	got, err := parseSizes("4K, 1M,8,2G", 4)
	if err != nil {
		t.Fatal(err)
	}
	want := []int{4 << 10, 1 << 20, 8, 2 << 30}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("got %v, want %v", got, want)
		}
	}
}

func TestItersLikePyTorch(t *testing.T) {
	c := allreduceConfig{dtype: "float32"}
	for bytes, want := range map[int]int{4 << 10: 200, 1 << 20: 64, 4 << 20: 16, 64 << 20: 5} {
		if got := c.itersFor(bytes); got != want {
			t.Errorf("itersFor(%d) = %d, want %d", bytes, got, want)
		}
	}
}
