package shm_test

import (
	"context"
	"errors"
	"syscall"
	"testing"
	"time"

	"gorgonia.org/tensor"

	"github.com/tandemml/tandem/comm"
)

// stagedElems is the length of the staged all-reduces of the process
// tests: 48 MiB of float32, 24 blocks of the staging segment, tens of
// milliseconds an all-reduce.
const stagedElems = 12 << 20

// TestStagedPeerLost: a rank whose process is killed, or stopped, in the
// middle of a stream of staged all-reduces (which wait for each other in
// the staging segment, not in the transport) makes the others' all-reduce
// fail with ErrPeerLost soon after, instead of leaving it to its deadline.
func TestStagedPeerLost(t *testing.T) {
	for _, c := range []struct {
		role  string
		sig   syscall.Signal
		limit time.Duration // how soon the loss must be noticed
	}{{"stage-kill", syscall.SIGKILL, 2 * time.Second}, {"stage-stop", syscall.SIGSTOP, 5 * time.Second}} {
		t.Run(c.role, func(t *testing.T) {
			tr, _, cmds := startRanks(t, "shm", c.role, 3)
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			pg, err := comm.NewProcessGroup(ctx, tr)
			if err != nil {
				t.Fatal(err)
			}
			x := tensor.New(tensor.WithShape(stagedElems), tensor.Of(tensor.Float32))
			for i := range 2 {
				if err := pg.AllReduce(ctx, x, comm.Sum).Wait(ctx); err != nil {
					t.Fatalf("all-reduce %d: %v", i, err)
				}
			}
			var sent time.Time
			signalled := make(chan struct{})
			time.AfterFunc(20*time.Millisecond, func() {
				sent = time.Now()
				if err := cmds[0].Process.Signal(c.sig); err != nil {
					t.Error(err)
				}
				close(signalled)
			})
			for err == nil {
				err = pg.AllReduce(ctx, x, comm.Sum).Wait(ctx)
			}
			<-signalled
			if !errors.Is(err, comm.ErrPeerLost) {
				t.Fatalf("all-reduce with a lost rank: got %v, want ErrPeerLost", err)
			}
			if d := time.Since(sent); d > c.limit {
				t.Errorf("the lost rank was noticed %v after the signal", d)
			}
			t.Log(err)
		})
	}
}
