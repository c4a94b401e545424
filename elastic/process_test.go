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
	"github.com/tandemml/tandem/internal/testlog"
)

// childEnv makes the test binary a member process: "ADDR ID STEPS OUT
// [PAUSE SEED SLOW GO]": it meets at the store at ADDR, trains until the
// job has committed STEPS steps, sleeping PAUSE (a Go duration, default
// 15ms) after each commit, and slowPause more while the file SLOW exists
// ("-": none), from initial weights drawn with SEED (default 1), and writes
// its report to OUT. With GO (not "-") it prints READY once started and
// joins the job only when the file GO exists, so that members started on a
// loaded machine still meet in one first round.
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
	pause, seed := 15*time.Millisecond, uint64(1)
	if len(f) > 4 {
		var err error
		if pause, err = time.ParseDuration(f[4]); err != nil {
			t.Fatal(err)
		}
	}
	if len(f) > 5 {
		var err error
		if seed, err = strconv.ParseUint(f[5], 10, 64); err != nil {
			t.Fatal(err)
		}
	}
	slow := ""
	if len(f) > 6 && f[6] != "-" {
		slow = f[6]
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if len(f) > 7 && f[7] != "-" {
		fmt.Println("READY")
		for {
			if _, err := os.Stat(f[7]); err == nil {
				break
			}
			select {
			case <-ctx.Done():
				t.Fatalf("%s never appeared", f[7])
			case <-time.After(5 * time.Millisecond):
			}
		}
	}
	st, err := store.NewTCP(ctx, f[0], false)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	cfg := fastConfig()
	cfg.MaxSize = 3
	mb := newMember(t, ctx, st, f[1], seed, cfg)
	defer mb.m.Close()
	mb.afterCommit = func(step int64) {
		fmt.Printf("STEP %d\n", step)
		time.Sleep(pause) // a job long enough to hit mid-run
		if slow != "" {
			if _, err := os.Stat(slow); err == nil {
				time.Sleep(slowPause)
			}
		}
	}
	if err := mb.train(ctx, steps); err != nil {
		t.Fatal(err)
	}
	b, _ := json.Marshal(childReport{Params: mb.params(), Events: mb.m.Events()})
	if err := os.WriteFile(f[3], b, 0o644); err != nil {
		t.Fatal(err)
	}
}

// slowPause is a member's extra pause after each commit while its SLOW file
// exists: a test holds the job back with it while a member it lost finds
// its way back.
const slowPause = 150 * time.Millisecond

type memberProc struct {
	cmd   *exec.Cmd
	out   string
	steps chan int64
	// ready is closed when the member prints READY.
	ready chan struct{}
	// started is when the process was started, first when it reported its
	// first committed step (set before that step is sent on steps).
	started, first time.Time
	// logs holds the member's stderr when the caller captures it.
	logs *testlog.Buffer
	// exited is closed when the process has exited, with its error in
	// err.
	exited chan struct{}
	err    error
}

// memberSpec is the childEnv setting of a member; slow or gate "" is none.
func memberSpec(addr, id string, steps int64, out string, pause time.Duration, seed uint64, slow, gate string) string {
	if slow == "" {
		slow = "-"
	}
	if gate == "" {
		gate = "-"
	}
	return fmt.Sprintf("%s=%s %s %d %s %s %d %s %s", childEnv, addr, id, steps, out, pause, seed, slow, gate)
}

func startMember(t *testing.T, addr, id string, steps int64) *memberProc {
	t.Helper()
	out := filepath.Join(t.TempDir(), id+".json")
	cmd := exec.Command(os.Args[0], "-test.run=^TestHelperMember$", "-test.count=1")
	cmd.Env = append(os.Environ(), memberSpec(addr, id, steps, out, 15*time.Millisecond, 1, "", ""))
	cmd.Stderr = os.Stderr
	if !testing.Verbose() {
		cmd.Stderr = nil
	}
	return runMember(t, cmd, out, nil)
}

// runMember starts cmd, a member process that writes its report to out, and
// follows the steps it reports; the rest of its stdout (the test
// framework's output) goes to logs, when not nil. The process is killed
// when the test ends.
func runMember(t *testing.T, cmd *exec.Cmd, out string, logs *testlog.Buffer) *memberProc {
	t.Helper()
	pipe, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	p := &memberProc{cmd: cmd, out: out, steps: make(chan int64, 4096), ready: make(chan struct{}), started: time.Now(), exited: make(chan struct{}), logs: logs}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		defer close(p.exited)
		sc := bufio.NewScanner(pipe)
		for sc.Scan() {
			if s, ok := strings.CutPrefix(sc.Text(), "STEP "); ok {
				n, _ := strconv.ParseInt(s, 10, 64)
				if p.first.IsZero() {
					p.first = time.Now()
				}
				p.steps <- n
			} else if sc.Text() == "READY" {
				close(p.ready)
			} else if logs != nil {
				logs.Write([]byte(sc.Text() + "\n"))
			}
		}
		close(p.steps)
		// Every read is done (Wait closes the pipe).
		p.err = cmd.Wait()
	}()
	t.Cleanup(func() {
		if t.Failed() {
			// Into the log: where a member still running is.
			p.logTail()
		}
		cmd.Process.Kill()
		select {
		case <-p.exited:
		case <-time.After(10 * time.Second):
			t.Errorf("member %s: not gone 10s after SIGKILL", out)
		}
	})
	return p
}

// waitStep waits until the member reports step n.
func (p *memberProc) waitStep(t *testing.T, n int64) {
	t.Helper()
	p.waitStepWithin(t, n, 30*time.Second)
}

// waitStepWithin waits at most limit until the member reports step n.
func (p *memberProc) waitStepWithin(t *testing.T, n int64, limit time.Duration) {
	t.Helper()
	deadline := time.After(limit)
	for {
		select {
		case s, ok := <-p.steps:
			if !ok {
				t.Fatalf("member exited before step %d%s", n, p.logTail())
			}
			if s >= n {
				return
			}
		case <-deadline:
			t.Fatalf("no step %d within %v%s", n, limit, p.logTail())
		}
	}
}

// logTail returns the member's captured output, for a failure message.
// A member still running is first asked for its goroutines (SIGQUIT), so
// that the log shows where it is stuck.
func (p *memberProc) logTail() string {
	if p.logs == nil {
		return ""
	}
	select {
	case <-p.exited:
	default:
		if p.cmd.Process.Signal(syscall.SIGQUIT) == nil {
			select {
			case <-p.exited:
			case <-time.After(5 * time.Second):
			}
		}
	}
	return "; its log:\n" + p.logs.String()
}

func (p *memberProc) report(t *testing.T) childReport {
	t.Helper()
	return p.reportWithin(t, 60*time.Second)
}

// reportWithin waits at most limit for the member to finish and returns
// its report.
func (p *memberProc) reportWithin(t *testing.T, limit time.Duration) childReport {
	t.Helper()
	select {
	case <-p.exited:
		if p.err != nil {
			t.Fatalf("member: %v%s", p.err, p.logTail())
		}
	case <-time.After(limit):
		t.Fatalf("member did not finish within %v%s", limit, p.logTail())
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

func serveStore(t *testing.T) string { return serveStoreAt(t, "127.0.0.1:0") }

// serveStoreAt serves a TCP store at addr until the test ends.
func serveStoreAt(t *testing.T, addr string) string {
	t.Helper()
	srv, err := store.NewServer(addr)
	if err != nil {
		t.Fatal(err)
	}
	ctx, stop := context.WithCancel(context.Background())
	go srv.Serve(ctx)
	t.Cleanup(func() { stop(); srv.Close() })
	return srv.Addr()
}

// dialStore is a client of the store at addr, closed when the test ends.
func dialStore(t *testing.T, addr string) store.Store {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	st, err := store.NewTCP(ctx, addr, false)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	return st
}
