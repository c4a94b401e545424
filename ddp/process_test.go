package ddp_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tandemml/tandem/comm"
	"github.com/tandemml/tandem/ddp"
	"github.com/tandemml/tandem/internal/childtest"
)

// helperEnv selects the role of a re-executed test binary.
const helperEnv = "TANDEM_DDP_HELPER"

// TestHelperDDPProcess is not a test: it is the body of the worker processes
// that TestRankDyingMidStep starts by re-executing this test binary. Each
// joins the world from the environment and trains; the rank named by
// DDP_VICTIM exits abruptly from inside its comm hook at the third step, in
// the middle of the step's bucket reductions. The others report how their
// step failed.
func TestHelperDDPProcess(t *testing.T) {
	if os.Getenv(helperEnv) != "train" {
		t.Skip("helper process for TestRankDyingMidStep")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	pg, err := comm.InitFromEnv(ctx, comm.WithInitTimeout(30*time.Second), comm.WithoutDefault(),
		comm.WithGroupOptions(comm.WithTimeout(time.Minute)))
	if err != nil {
		fmt.Printf("INITERR %v\n", err)
		os.Exit(2)
	}
	victim, _ := strconv.Atoi(os.Getenv("DDP_VICTIM"))
	step := 0
	hook := func(ctx context.Context, _ struct{}, b *ddp.GradBucket) ddp.Future {
		if pg.Rank() == victim && step == 2 && b.Index() == 1 {
			os.Exit(7) // dies with bucket 0 sent and bucket 1 not
		}
		return ddp.AllReduceHook(ctx, nil, b)
	}
	sizes := []int{32, 64, 64, 10}
	net, err := ddp.New(ctx, pg, newMLP(t, sizes, 1), ddp.BucketCapMB(8000.0/(1<<20)), ddp.WithCommHook(struct{}{}, hook))
	if err != nil {
		fmt.Printf("NEWERR %v\n", err)
		os.Exit(2)
	}
	x, y := batch(uint64(pg.Rank()), 8, sizes[0], 10)
	for ; step < 10; step++ {
		if _, err := net.Step(ctx, x, y); err != nil {
			fmt.Printf("ERR step=%d peerlost=%v timeout=%v: %v\n", step, errors.Is(err, comm.ErrPeerLost), errors.Is(err, comm.ErrTimeout), err)
			os.Exit(3)
		}
	}
	fmt.Println("FINISHED")
	os.Exit(0)
}

// TestRankDyingMidStep runs three real processes over TCP; one exits in the
// middle of a step. Every survivor's Step must fail with ErrPeerLost well
// within the group's one-minute timeout.
func TestRankDyingMidStep(t *testing.T) {
	if testing.Short() {
		t.Skip("starts processes")
	}
	for _, victim := range []int{2, 0} { // rank 0 also serves the store
		t.Run(fmt.Sprintf("rank %d dies", victim), func(t *testing.T) {
			const world = 3
			start := time.Now()
			outs := childtest.Ranks(t, world, 60*time.Second, "TestHelperDDPProcess",
				helperEnv+"=train", "DDP_VICTIM="+strconv.Itoa(victim), "TANDEM_TOKEN=ddp-kill-test")
			for r, out := range outs {
				if r == victim {
					continue
				}
				l, _, _ := strings.Cut(out, "\n")
				if !strings.HasPrefix(l, "ERR step=2 peerlost=true timeout=false") {
					t.Errorf("rank %d: want its third step to fail with ErrPeerLost, got %s", r, out)
				}
				t.Logf("rank %d: %s", r, l)
			}
			t.Logf("every rank exited after %v", time.Since(start).Round(time.Millisecond))
		})
	}
}
