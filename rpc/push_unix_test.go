//go:build unix

package rpc

import (
	"testing"
	"time"

	"gorgonia.org/tensor"

	"github.com/tandemml/tandem/internal/testkit"
)

// TestPushAcrossProcesses: between two processes, large arguments and
// replies are pushed (this process counts its pushed arguments; the
// worker's pushed replies show as replies that arrive whole although each
// differs), call after call, at two sizes.
func TestPushAcrossProcesses(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a process")
	}
	ctx := testkit.Context(t, 60*time.Second)
	a, _, out := withServingWorker(t, ctx, "push-test-token")
	if _, err := Sync[*tensor.Dense](ctx, a, "worker1", "echo", filled(pushFrom/4, 0)); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if c := a.peers[1].cur.Load(); c == nil || !c.pushOK {
		t.Skip("same-host copies are not available both ways between processes here")
	}
	for _, n := range []int{pushFrom / 4, 2 * pushFrom} {
		before := a.Metrics().PushedTensors
		for i := 0; i < 10; i++ {
			x := filled(n, float32(i))
			y, err := Sync[*tensor.Dense](ctx, a, "worker1", "echo", x)
			if err != nil {
				t.Fatalf("%v\n%s", err, out)
			}
			if !sameTensor(x, y) {
				t.Fatalf("%d floats, call %d: the echo differs", n, i)
			}
		}
		if got := a.Metrics().PushedTensors - before; got < 9 {
			t.Fatalf("%d floats: %d arguments pushed in 10 calls, want at least 9", n, got)
		}
	}
}
