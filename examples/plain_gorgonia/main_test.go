package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/tandemml/tandem/comm"
	"github.com/tandemml/tandem/comm/commtest"
	"github.com/tandemml/tandem/ddp"
	"github.com/tandemml/tandem/internal/childtest"
	"github.com/tandemml/tandem/internal/testkit"
)

func testConfig() config {
	return config{steps: 300, batch: 32, lr: 0.05, every: 100, bucket: ddp.DefaultBucketCapMB, seed: 1, timeout: time.Minute}
}

// trainRanks runs the tutorial on world goroutine ranks; only rank 0 may
// print.
func trainRanks(t *testing.T, world int, c config) ([]*result, string) {
	t.Helper()
	ctx := testkit.Context(t, time.Minute)
	res := make([]*result, world)
	outs := commtest.LocalRanks(t, ctx, world, func(pg *comm.ProcessGroup, out io.Writer) (err error) {
		res[pg.Rank()], err = train(ctx, pg, c, out)
		return err
	})
	for r := 1; r < world; r++ {
		assert.Emptyf(t, outs[r], "rank %d printed; only rank 0 reports", r)
	}
	return res, outs[0]
}

// TestTutorial trains on two goroutine ranks, under Tandem's executor with
// a bucket per node (so reductions overlap the backward pass) and under
// gorgonia's TapeMachine, and checks that the loss falls, the replicas agree
// and rank 0 reports.
func TestTutorial(t *testing.T) {
	for _, tape := range []bool{false, true} {
		t.Run(fmt.Sprintf("tape=%v", tape), func(t *testing.T) {
			c := testConfig()
			c.tape = tape
			if !tape {
				c.bucket = 1e-4
			}
			res, out := trainRanks(t, 2, c)
			r := res[0]
			if !(r.lastLoss < r.firstLoss/20) {
				t.Errorf("loss went from %.4f to %.4f; want it at least 20 times lower", r.firstLoss, r.lastLoss)
			}
			for i := range r.weights {
				if r.weights[i] != res[1].weights[i] {
					t.Fatalf("weight %d differs across the ranks: %v vs %v", i, r.weights[i], res[1].weights[i])
				}
			}
			if r.stats.Steps != int64(c.steps) {
				t.Errorf("%d synchronized steps, want %d", r.stats.Steps, c.steps)
			}
			if tape && r.stats.BucketsOverlapped != 0 || !tape && r.stats.BucketsOverlapped == 0 {
				t.Errorf("tape=%v: %d buckets started before backward ended", tape, r.stats.BucketsOverlapped)
			}
			for _, want := range []string{"rank 0 of 2: 3 learnable nodes", "step    1  loss", "step  300  loss", "replicas agree: largest difference from rank 0's weights 0", "300 steps"} {
				if !strings.Contains(out, want) {
					t.Errorf("output lacks %q:\n%s", want, out)
				}
			}
		})
	}
}

// TestHelperProcess is not a test: it is a rank of TestProcesses, run as a
// process of its own with the environment tandem run would set.
func TestHelperProcess(t *testing.T) {
	if os.Getenv("PLAIN_GORGONIA_HELPER") != "1" {
		t.Skip("helper process for TestProcesses")
	}
	c := testConfig()
	c.steps = 100
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := run(ctx, c, os.Stdout); err != nil {
		fmt.Println("ERR", err)
		os.Exit(1)
	}
	os.Exit(0)
}

// TestProcesses runs the tutorial's main path, comm.InitFromEnv included,
// as two processes over TCP, as `tandem run -nproc 2` does.
func TestProcesses(t *testing.T) {
	if testing.Short() {
		t.Skip("starts processes")
	}
	outs := childtest.Ranks(t, 2, 90*time.Second, "TestHelperProcess", "PLAIN_GORGONIA_HELPER=1")
	for _, want := range []string{"rank 0 of 2", "step  100  loss", "replicas agree: largest difference from rank 0's weights 0"} {
		if !strings.Contains(outs[0], want) {
			t.Errorf("rank 0's output lacks %q:\n%s", want, outs[0])
		}
	}
	if strings.Contains(outs[1], "ERR") || strings.Contains(outs[1], "exit") {
		t.Errorf("rank 1: %s", outs[1])
	}
}
