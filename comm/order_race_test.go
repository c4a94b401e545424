//go:build race

package comm_test

import (
	"context"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tandemml/tandem/comm"
	"github.com/tandemml/tandem/comm/local"
	"gorgonia.org/tensor"
)

const issueOrderEnv = "TANDEM_TEST_ISSUE_ORDER"

// issueFromTwoGoroutines issues two equal-shaped all-reduces on each rank's
// group from two goroutines; with ordered set, a mutex orders the issues.
func issueFromTwoGoroutines(t *testing.T, ordered bool) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	pgs, err := local.NewGroups(ctx, 2)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		for _, pg := range pgs {
			pg.Close()
		}
	}()
	var wg sync.WaitGroup
	for _, pg := range pgs {
		var mu sync.Mutex
		for range 2 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				x := tensor.New(tensor.WithShape(4), tensor.WithBacking([]float32{1, 2, 3, 4}))
				if ordered {
					mu.Lock()
				}
				w := pg.AllReduce(ctx, x, comm.Sum)
				if ordered {
					mu.Unlock()
				}
				if err := w.Wait(ctx); err != nil {
					t.Error(err)
				}
			}()
		}
	}
	wg.Wait()
}

// TestIssueOrderChild is the child process of TestIssueOrderCaughtByRace.
func TestIssueOrderChild(t *testing.T) {
	switch os.Getenv(issueOrderEnv) {
	case "unordered":
		issueFromTwoGoroutines(t, false)
	case "ordered":
		issueFromTwoGoroutines(t, true)
	}
}

// Two goroutines issuing equal-shaped collectives on one group, with nothing
// ordering them, cannot be told apart on the wire; the race detector reports
// them. The same two goroutines ordered by a mutex are not reported.
func TestIssueOrderCaughtByRace(t *testing.T) {
	run := func(mode string) (string, error) {
		cmd := exec.Command(os.Args[0], "-test.run=^TestIssueOrderChild$", "-test.count=1", "-test.v")
		cmd.Env = append(os.Environ(), issueOrderEnv+"="+mode, "GORACE=halt_on_error=1")
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	out, err := run("unordered")
	if err == nil || !strings.Contains(out, "DATA RACE") || !strings.Contains(out, "issueOrder") {
		t.Fatalf("unordered issues from two goroutines were not reported as a race on issueOrder (err %v):\n%s", err, out)
	}
	out, err = run("ordered")
	if err != nil || strings.Contains(out, "DATA RACE") {
		t.Fatalf("issues ordered by a mutex were reported (err %v):\n%s", err, out)
	}
}
