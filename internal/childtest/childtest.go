// Package childtest runs a test's other process: the test binary started
// again with one helper test selected and an environment variable set, which
// serves until the parent closes its stdin. Tandem's tests use it for a
// server whose memory is measured under a flood, and for a process whose
// memory another must not be able to read.
//
// The parent:
//
//	c := childtest.Start(t, "the server", "TestHelperServer", serverEnv+"=1")
//	addr := c.Line(t, "ADDR")
//
// The child, a test that does nothing in a normal run:
//
//	func TestHelperServer(t *testing.T) {
//		childtest.Main(serverEnv, "server", func(stop context.Context, _ string) error {
//			// ... print "ADDR host:port", serve until stop ends ...
//		})
//	}
package childtest

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

// StopWait bounds how long a child has to exit once its stdin closes.
const StopWait = 15 * time.Second

// Child is a running child process.
type Child struct {
	// Pid is the child's process id.
	Pid int
	// Out reads the child's stdout.
	Out *bufio.Reader
	// Logs holds what the child wrote on stderr.
	Logs *testlog.Buffer

	name string
}

// Start runs the test binary again with only the test named helper, and env
// ("NAME=value") added to its environment; name says what the child is in
// messages. When the test ends it closes the child's stdin and fails the
// test if the child does not then exit cleanly within StopWait (killing it
// if it does not exit at all).
func Start(t testing.TB, name, helper, env string) *Child {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^"+helper+"$", "-test.count=1")
	cmd.Env = append(os.Environ(), env)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	c := &Child{Out: bufio.NewReader(stdout), Logs: &testlog.Buffer{}, name: name}
	cmd.Stderr = c.Logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	c.Pid = cmd.Process.Pid
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
	return c
}

// Line reads the child's next line on stdout, which must start with word and
// a space (any line will do when word is empty), and returns the rest,
// trimmed; it fails the test otherwise.
func (c *Child) Line(t testing.TB, word string) string {
	t.Helper()
	line, err := c.Out.ReadString('\n')
	rest := strings.TrimSpace(line)
	ok := true
	if word != "" {
		rest, ok = strings.CutPrefix(rest, word+" ")
	}
	if err != nil || !ok {
		t.Fatalf("%s did not print its %s line (%q, %v):\n%s", c.name, word, line, err, c.Logs)
	}
	return rest
}

// Main is the body of the helper test that Start runs. When env is set in
// the environment, this process is the child: Main runs body with the
// variable's value and a context that ends when stdin closes (the parent's
// word to stop), and exits the process, with status 0 if body returns nil
// and otherwise 1 after writing name and the error on stderr. When env is
// not set, it returns at once, so that the helper test does nothing in a
// normal run.
func Main(env, name string, body func(stop context.Context, value string) error) {
	value := os.Getenv(env)
	if value == "" {
		return
	}
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
