//go:build unix

package rpc

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/tandemml/tandem/internal/testkit"
)

// startServingWorker starts this test binary as a worker process that
// serves until killed (TEST_MODE=serve), with the extra environment env.
func startServingWorker(t *testing.T, env ...string) (*exec.Cmd, *bytes.Buffer) {
	t.Helper()
	var out bytes.Buffer
	cmd := exec.Command(os.Args[0], "-test.run=^TestHelperWorker$")
	cmd.Env = append(append(os.Environ(), helperEnv+"=1", "TEST_MODE=serve"), env...)
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Signal(syscall.SIGCONT)
		cmd.Process.Kill()
		cmd.Wait()
	})
	return cmd, &out
}

// withServingWorker starts a worker process as rank 1 of two (serving
// registerBasics until killed) and this process's agent as rank 0, over a
// store here; the agent closes when the test ends. out is the worker's
// output, for failures.
func withServingWorker(t *testing.T, ctx context.Context, token string) (a *Agent, child *exec.Cmd, out *bytes.Buffer) {
	t.Helper()
	st, port := masterStore(t, ctx, token)
	child, out = startServingWorker(t, "RANK=1", "WORLD_SIZE=2", "MASTER_ADDR=127.0.0.1", "MASTER_PORT="+port, TokenEnv+"="+token)
	reg := NewRegistry()
	registerBasics(0, reg)
	a, err := Init(ctx, "", 0, 2, WithStore(st), WithRegistry(reg), WithToken(token))
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	t.Cleanup(func() { a.Close() })
	return a, child, out
}

// waitStopped waits until process pid is stopped (a signal is delivered
// asynchronously: a call made at once could still be answered).
func waitStopped(t *testing.T, pid int) {
	t.Helper()
	stat := fmt.Sprintf("/proc/%d/stat", pid)
	deadline := time.Now().Add(5 * time.Second)
	for {
		b, err := os.ReadFile(stat)
		if err != nil {
			time.Sleep(50 * time.Millisecond) // no /proc: give the signal time
			return
		}
		if strings.Contains(string(b), ") T ") {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("process %d not stopped 5s after SIGSTOP: %s", pid, b)
		}
		time.Sleep(time.Millisecond)
	}
}

// TestCallToStoppedWorkerFails: a call in flight to a worker process that
// is stopped (SIGSTOP: its kernel still acknowledges every byte) fails with
// ErrPeerLost within the default liveness timeout, saying the worker is
// unresponsive, where it used to wait for the call's whole timeout (60 s
// by default).
func TestCallToStoppedWorkerFails(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a process")
	}
	ctx := testkit.Context(t, 60*time.Second)
	a, child, _ := withServingWorker(t, ctx, "liveness-test-token")
	if v, err := Sync[int](ctx, a, "worker1", "add", [2]int{1, 2}); err != nil || v != 3 {
		t.Fatalf("add before the stop: %v %v", v, err)
	}
	if err := child.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	waitStopped(t, child.Process.Pid)
	start := time.Now()
	_, err := Sync[string](ctx, a, "worker1", "sleep", time.Millisecond)
	took := time.Since(start)
	if !errors.Is(err, ErrPeerLost) || !strings.Contains(err.Error(), "unresponsive") || !strings.Contains(err.Error(), "worker1") {
		t.Fatalf("call to a stopped worker: %v after %v, want ErrPeerLost saying worker1 is unresponsive", err, took)
	}
	if took > 10*time.Second || took < DefaultLivenessTimeout-time.Second {
		t.Fatalf("call to a stopped worker failed after %v, want about %v", took, DefaultLivenessTimeout)
	}
	t.Logf("call to a stopped worker failed after %v: %v", took.Round(time.Millisecond), err)
}

// TestShutdownStoreHostDies: when the worker that serves the store (rank 0,
// from MASTER_ADDR) dies, the others' graceful shutdown fails within
// seconds with ErrPeerLost naming it, instead of redialling the store's
// refused port until the deadline.
func TestShutdownStoreHostDies(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a process")
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	_, port, _ := net.SplitHostPort(ln.Addr().String())
	ln.Close()
	const token = "store-host-test-token"
	t.Setenv("MASTER_ADDR", "127.0.0.1")
	t.Setenv("MASTER_PORT", port)
	t.Setenv(TokenEnv, token)
	child, out := startServingWorker(t, "RANK=0", "WORLD_SIZE=2")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	reg := NewRegistry()
	registerBasics(1, reg)
	a, err := Init(ctx, "", 1, 2, WithRegistry(reg))
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if v, err := Sync[int](ctx, a, "worker0", "add", [2]int{2, 2}); err != nil || v != 4 {
		t.Fatalf("add: %v %v", v, err)
	}
	done := make(chan error, 1)
	sctx, scancel := context.WithTimeout(context.Background(), time.Minute)
	defer scancel()
	go func() { done <- a.Shutdown(sctx) }()
	time.Sleep(300 * time.Millisecond)
	start := time.Now()
	if err := child.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	select {
	case err = <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("shutdown still waiting 30s after the store's host died")
	}
	took := time.Since(start)
	if !errors.Is(err, ErrPeerLost) || !strings.Contains(err.Error(), "worker0") || !strings.Contains(err.Error(), "store") {
		t.Fatalf("shutdown after the store's host died: %v, want ErrPeerLost naming worker0 and the store", err)
	}
	if took > 10*time.Second {
		t.Fatalf("shutdown took %v to notice the store's host died", took)
	}
	t.Logf("shutdown failed %v after the store's host died: %v", took.Round(time.Millisecond), err)
}
