package comm_test

import (
	"context"
	"errors"
	"runtime"
	"testing"
	"time"

	"github.com/tandemml/tandem/comm"
	"github.com/tandemml/tandem/comm/local"
	"github.com/tandemml/tandem/internal/testkit"
	"gorgonia.org/tensor"
)

// A collective queued behind one that cannot finish fails when its own
// context ends, not when the one before it gives up; the group is aborted,
// so the one before it fails too instead of waiting for its deadline.
func TestQueuedCollectiveFailsAtItsOwnDeadline(t *testing.T) {
	ctx := testkit.Context(t, 30*time.Second)
	pgs, err := local.NewGroups(ctx, 2)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		for _, pg := range pgs {
			pg.Close()
		}
	}()
	x := tensor.New(tensor.WithShape(4), tensor.WithBacking([]float32{1, 2, 3, 4}))
	first := pgs[0].AllReduce(ctx, x, comm.Sum) // rank 1 never joins
	short, cancelShort := context.WithTimeout(ctx, 100*time.Millisecond)
	defer cancelShort()
	start := time.Now()
	second := pgs[0].Broadcast(short, x, 0)
	err = second.Wait(ctx)
	if !errors.Is(err, comm.ErrTimeout) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("queued collective: got %v, want ErrTimeout wrapping context.DeadlineExceeded", err)
	}
	if took := time.Since(start); took > 10*time.Second {
		t.Errorf("queued collective failed after %v; its deadline was 100ms", took)
	}
	if err := first.Wait(ctx); err == nil {
		t.Errorf("the collective rank 1 never joined succeeded")
	}
	if err := pgs[0].Barrier(ctx).Wait(ctx); err == nil {
		t.Errorf("the group still runs collectives after an abort")
	}
}

// Collectives issued back to back run in issue order on one runner, and
// closing the group stops it.
func TestRunnerStopsWithTheGroup(t *testing.T) {
	before := runtime.NumGoroutine()
	ctx := testkit.Context(t, 30*time.Second)
	pgs, err := local.NewGroups(ctx, 3)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, len(pgs))
	for r, pg := range pgs {
		go func() {
			x := tensor.New(tensor.WithShape(2), tensor.WithBacking([]int64{int64(r), 1}))
			var works []comm.Work
			for k := range 20 {
				works = append(works, pg.AllReduce(ctx, x, comm.Sum)) // each round triples both values
				if k%5 == 4 {
					works = append(works, pg.Barrier(ctx))
				}
			}
			for _, w := range works {
				if err := w.Wait(ctx); err != nil {
					done <- err
					return
				}
			}
			want := int64(3)
			for range 19 {
				want *= 3
			}
			if got := x.Data().([]int64); got[0] != want || got[1] != want {
				t.Errorf("rank %d: got %v, want [%d %d]", r, got, want, want)
			}
			done <- nil
		}()
	}
	for range pgs {
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	}
	for _, pg := range pgs {
		if err := pg.Close(); err != nil {
			t.Fatal(err)
		}
	}
	testkit.RequireNoLeak(t, before)
}
