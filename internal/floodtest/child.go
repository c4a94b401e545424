package floodtest

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/tandemml/tandem/internal/testlog"
)

// ChildMain is the body of the helper test that StartChild runs. When env
// is set in the environment, this process is the child: ChildMain serves
// ServeFreeOSMemory, runs body with the variable's value and a context that
// ends when stdin closes (the parent's word to stop), and exits the
// process, with status 0 if body returns nil and otherwise 1 after writing
// name and the error on stderr. When env is not set, it returns at once, so
// that the helper test does nothing in a normal run.
func ChildMain(env, name string, body func(stop context.Context, value string) error) {
	value := os.Getenv(env)
	if value == "" {
		return
	}
	defer ServeFreeOSMemory()()
	stop, cancel := context.WithCancel(context.Background())
	go func() {
		io.Copy(io.Discard, os.Stdin)
		cancel()
	}()
	if err := body(stop, value); err != nil {
		fmt.Fprintf(os.Stderr, "%s: %v\n", name, err)
		os.Exit(1)
	}
	os.Exit(0)
}

// StopWait bounds how long a child has to exit once its stdin closes.
const StopWait = 15 * time.Second

// Child is a server under test in a process of its own, so that its memory
// can be measured: the test binary run again with one helper test selected,
// which serves until its stdin closes.
type Child struct {
	// Pid is the child's process id.
	Pid int
	// Ready is the rest of the first line the child printed on stdout,
	// after the ready word (its address, say); empty without one.
	Ready string
	// Out reads the child's stdout after that line (RSSAfterFree reads its
	// Freed lines there); nil without a ready word.
	Out *bufio.Reader
	// Logs holds what the child wrote on stderr (and on stdout, without a
	// ready word).
	Logs *testlog.Buffer
}

// StartChild runs the test binary again with only the test named helper and
// env ("NAME=value") added to its environment; name says what the child is
// in messages. With a ready word, it waits for the child's first line on
// stdout, which must be ready, a space and the rest (Child.Ready), and fails
// the test otherwise. When the test ends it closes the child's stdin and
// fails the test if the child does not then exit cleanly within StopWait
// (killing it if it does not exit at all).
func StartChild(t testing.TB, name, helper, env, ready string) *Child {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^"+helper+"$", "-test.count=1")
	cmd.Env = append(os.Environ(), env)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	c := &Child{Logs: &testlog.Buffer{}}
	cmd.Stderr = c.Logs
	var stdout *bufio.Reader
	if ready == "" {
		cmd.Stdout = c.Logs
	} else {
		p, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		stdout = bufio.NewReader(p)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() {
		stdin.Close()
		select {
		case err := <-exited:
			if err != nil {
				t.Errorf("%s: %v\n%s", name, err, c.Logs)
			}
		case <-time.After(StopWait):
			cmd.Process.Kill()
			t.Errorf("%s did not stop when its stdin closed", name)
		}
	})
	c.Pid = cmd.Process.Pid
	if ready != "" {
		line, err := stdout.ReadString('\n')
		rest, ok := strings.CutPrefix(strings.TrimSpace(line), ready+" ")
		if err != nil || !ok {
			t.Fatalf("%s did not print its %s line (%q, %v):\n%s", name, ready, line, err, c.Logs)
		}
		c.Ready, c.Out = rest, stdout
	}
	return c
}

// Memory is what a flood test measured of its child: RSS before the flood,
// at its peak and after it, and the bytes the Go runtime held for live
// objects and stacks before and after (the before and after figures taken
// by RSSAfterFree).
type Memory struct {
	Base, Peak, After   int64
	BaseHeld, AfterHeld int64
}

// Check logs the figures and fails the test where the growth passes
// PeakGrowth, AfterGrowth or HeldGrowth; who names the child in messages.
func (m Memory) Check(t testing.TB, who string) {
	t.Helper()
	t.Logf("%s: RSS baseline %.1f MiB, peak %.1f MiB, %.1f MiB after the flood; Go heap and stacks in use %.1f MiB before, %.1f MiB after "+
		"(both once it freed its unused memory)",
		who, MiB(m.Base), MiB(m.Peak), MiB(m.After), MiB(m.BaseHeld), MiB(m.AfterHeld))
	if m.Peak-m.Base > PeakGrowth {
		t.Errorf("%s: RSS grew by %.1f MiB under the flood; want at most %.0f MiB",
			who, MiB(m.Peak-m.Base), MiB(PeakGrowth))
	}
	if m.After-m.Base > AfterGrowth() {
		t.Errorf("%s: RSS stayed %.1f MiB above its baseline after the flood; want at most %.0f MiB",
			who, MiB(m.After-m.Base), MiB(AfterGrowth()))
	}
	if m.AfterHeld-m.BaseHeld > HeldGrowth {
		t.Errorf("%s holds %.1f MiB more live memory after the flood than before; want at most %.0f MiB",
			who, MiB(m.AfterHeld-m.BaseHeld), MiB(HeldGrowth))
	}
}
