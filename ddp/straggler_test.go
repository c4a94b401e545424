package ddp_test

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/tandemml/tandem/comm"
	"github.com/tandemml/tandem/comm/local"
	"github.com/tandemml/tandem/ddp"
	"github.com/tandemml/tandem/internal/testkit"
	"github.com/tandemml/tandem/internal/testlog"
	"github.com/tandemml/tandem/launch"
)

// One of three ranks sleeps 30 ms in each step of its training loop: every
// rank's Stats name it as the straggler, with its factor over the median;
// rank 0 logs it once (rate-limited); at INFO the bucket layout is logged
// when DDP is made and when it is rebuilt.
func TestStragglerIsNamed(t *testing.T) {
	var logs testlog.Buffer
	log := slog.New(slog.NewTextHandler(&logs, nil))
	pgs, err := local.NewGroups(context.Background(), 3, comm.WithTimeout(30*time.Second), comm.WithLogger(log),
		comm.WithDebugLevel(launch.DebugInfo), comm.WithFlightDir(t.TempDir()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { closeAll(pgs) })
	ctx := testCtx(t, time.Minute)
	const steps, every, slow = 12, 4, 30 * time.Millisecond
	stats := make([]ddp.Stats, 3)
	testkit.RequireEachRank(t, 3, func(r int) error {
		net, err := ddp.New(ctx, pgs[r], newMLP(t, []int{8, 16, 4}, 1), ddp.StragglerEvery(every))
		if err != nil {
			return err
		}
		x, y := batch(uint64(r), 8, 8, 4)
		for range steps {
			if r == 1 {
				time.Sleep(slow) // this rank's data loading is slow
			}
			if _, err := net.Step(ctx, x, y); err != nil {
				return err
			}
		}
		stats[r] = net.Stats()
		return nil
	})
	for r, s := range stats {
		st := s.Stragglers
		t.Logf("rank %d: %v", r, st)
		if st.Slowest != 1 || st.Factor < 3 || st.Step != steps || st.Window != every || len(st.Times) != 3 {
			t.Fatalf("rank %d: want rank 1 named the straggler, got %v", r, st)
		}
		if st.Times[1] < slow {
			t.Fatalf("rank %d: rank 1's time %v is less than its sleep %v", r, st.Times[1], slow)
		}
		if !strings.Contains(s.String(), "slowest rank 1:") {
			t.Fatalf("Stats.String does not report the straggler:\n%s", s)
		}
	}
	out := logs.String()
	if n := strings.Count(out, `msg="comm: straggler: rank 1 is slowest"`); n != 1 {
		t.Fatalf("want one straggler log line, got %d:\n%s", n, out)
	}
	if n := strings.Count(out, `msg="ddp: bucket layout"`); n != 2 {
		t.Fatalf("want the layout logged at New and at the rebuild, got %d:\n%s", n, out)
	}
	if !strings.Contains(out, fmt.Sprintf("why=initial group=world buckets=%d", len(stats[0].Buckets))) {
		t.Fatalf("layout log: %s", out)
	}
}

// Ranks with equal work are not stragglers: the factor stays near 1, and
// StragglerEvery(-1) turns the exchange off.
func TestNoStragglerWhenEven(t *testing.T) {
	pgs := localWorld(t, 3)
	ctx := testCtx(t, time.Minute)
	stats := make([]ddp.Stats, 3)
	off := make([]ddp.Stats, 3)
	testkit.RequireEachRank(t, 3, func(r int) error {
		net, err := ddp.New(ctx, pgs[r], newMLP(t, []int{8, 16, 4}, 1), ddp.StragglerEvery(5))
		if err != nil {
			return err
		}
		quiet, err := ddp.New(ctx, pgs[r], newMLP(t, []int{8, 16, 4}, 1), ddp.StragglerEvery(-1))
		if err != nil {
			return err
		}
		x, y := batch(uint64(r), 8, 8, 4)
		for range 10 {
			time.Sleep(20 * time.Millisecond) // the same on every rank, and far longer than a step
			if _, err := net.Step(ctx, x, y); err != nil {
				return err
			}
			if _, err := quiet.Step(ctx, x, y); err != nil {
				return err
			}
		}
		stats[r], off[r] = net.Stats(), quiet.Stats()
		return nil
	})
	for r := range 3 {
		if st := stats[r].Stragglers; st.Step != 10 || st.Factor > 1.5 {
			t.Fatalf("rank %d: even ranks reported as stragglers: %v", r, st)
		}
		if len(off[r].Stragglers.Times) != 0 {
			t.Fatalf("rank %d: StragglerEvery(-1) still exchanged: %v", r, off[r].Stragglers)
		}
	}
}
