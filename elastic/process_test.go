package elastic_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/tandemml/tandem/comm/store"
	"github.com/tandemml/tandem/elastic"
)

// childEnv makes the test binary a member process: "ADDR ID STEPS OUT".
const childEnv = "TANDEM_ELASTIC_TEST_MEMBER"

// childReport is what a member process leaves in its OUT file.
type childReport struct {
	Params []float64
	Events []elastic.Event
}

// TestHelperMember is a member process of the fault tests; in a normal run
// it does nothing.
func TestHelperMember(t *testing.T) {
	spec := os.Getenv(childEnv)
	if spec == "" {
		return
	}
	f := strings.Fields(spec)
	steps, _ := strconv.ParseInt(f[2], 10, 64)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	st, err := store.NewTCP(ctx, f[0], false)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	cfg := fastConfig()
	cfg.MaxSize = 3
	mb := newMember(t, ctx, st, f[1], 1, cfg)
	defer mb.m.Close()
	mb.afterCommit = func(step int64) {
		fmt.Printf("STEP %d\n", step)
		time.Sleep(15 * time.Millisecond) // a job long enough to hit mid-run
	}
	if err := mb.train(ctx, steps); err != nil {
		t.Fatal(err)
	}
	b, _ := json.Marshal(childReport{Params: mb.params(), Events: mb.m.Events()})
	if err := os.WriteFile(f[3], b, 0o644); err != nil {
		t.Fatal(err)
	}
}

type memberProc struct {
	cmd   *exec.Cmd
	out   string
	steps chan int64
}

func startMember(t *testing.T, addr, id string, steps int64) *memberProc {
	t.Helper()
	out := filepath.Join(t.TempDir(), id+".json")
	cmd := exec.Command(os.Args[0], "-test.run=^TestHelperMember$", "-test.count=1")
	cmd.Env = append(os.Environ(), fmt.Sprintf("%s=%s %s %d %s", childEnv, addr, id, steps, out))
	cmd.Stderr = os.Stderr
	if !testing.Verbose() {
		cmd.Stderr = nil
	}
	pipe, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &memberProc{cmd: cmd, out: out, steps: make(chan int64, 1024)}
	go func() {
		sc := bufio.NewScanner(pipe)
		for sc.Scan() {
			if s, ok := strings.CutPrefix(sc.Text(), "STEP "); ok {
				n, _ := strconv.ParseInt(s, 10, 64)
				p.steps <- n
			}
		}
		close(p.steps)
	}()
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	return p
}

// waitStep waits until the member reports step n.
func (p *memberProc) waitStep(t *testing.T, n int64) {
	t.Helper()
	deadline := time.After(30 * time.Second)
	for {
		select {
		case s, ok := <-p.steps:
			if !ok {
				t.Fatalf("member exited before step %d", n)
			}
			if s >= n {
				return
			}
		case <-deadline:
			t.Fatalf("no step %d within 30s", n)
		}
	}
}

func (p *memberProc) report(t *testing.T) childReport {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- p.cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("member: %v", err)
		}
	case <-time.After(60 * time.Second):
		t.Fatal("member did not finish within 60s")
	}
	b, err := os.ReadFile(p.out)
	if err != nil {
		t.Fatal(err)
	}
	var r childReport
	if err := json.Unmarshal(b, &r); err != nil {
		t.Fatal(err)
	}
	return r
}

// TestProcessFaults runs three member processes and hurts one of them
// mid-run: every survivor must resume within 3 s, lose no committed step,
// and end with the model of an undisturbed run.
func TestProcessFaults(t *testing.T) {
	if testing.Short() {
		t.Skip("starts member processes")
	}
	const steps, hitAt = 40, 10
	want := reference(t, steps)
	for _, fault := range []struct {
		name  string
		delay time.Duration // after the step's commit was reported
		sig   syscall.Signal
	}{
		{"kill -9 between steps", 0, syscall.SIGKILL},
		{"kill -9 inside a step", 8 * time.Millisecond, syscall.SIGKILL},
		{"SIGSTOP", 5 * time.Millisecond, syscall.SIGSTOP},
	} {
		t.Run(fault.name, func(t *testing.T) {
			addr := serveStore(t)
			ps := []*memberProc{startMember(t, addr, "a", steps), startMember(t, addr, "b", steps), startMember(t, addr, "c", steps)}
			ps[2].waitStep(t, hitAt)
			time.Sleep(fault.delay)
			hit := time.Now()
			if err := ps[2].cmd.Process.Signal(fault.sig); err != nil {
				t.Fatal(err)
			}
			for _, p := range ps[:2] {
				r := p.report(t)
				if d := maxDiff(r.Params, want); d > 1e-9 {
					t.Errorf("survivor differs from the undisturbed run by %g", d)
				}
				var ev *elastic.Event
				for i := range r.Events {
					if r.Events[i].Resumed.After(hit) {
						ev = &r.Events[i]
						break
					}
				}
				if ev == nil {
					t.Fatalf("no round after the fault: %+v", r.Events)
				}
				if ev.Size != 2 || ev.Step < hitAt {
					t.Errorf("round after the fault %+v, want size 2 from step >= %d", *ev, hitAt)
				}
				took := ev.Resumed.Sub(hit)
				if took > 3*time.Second {
					t.Errorf("resumed %v after the fault, want within 3s", took)
				}
				t.Logf("detected after %v, resumed after %v at step %d", ev.Detected.Sub(hit).Round(time.Millisecond), took.Round(time.Millisecond), ev.Step)
			}
		})
	}
}

func serveStore(t *testing.T) string {
	t.Helper()
	srv, err := store.NewServer("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, stop := context.WithCancel(context.Background())
	go srv.Serve(ctx)
	t.Cleanup(func() { stop(); srv.Close() })
	return srv.Addr()
}
