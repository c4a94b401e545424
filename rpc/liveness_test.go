package rpc

import (
	"bytes"
	"context"
	"errors"
	"net"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/tandemml/tandem/comm/store"
	"gorgonia.org/tensor"
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

// TestCallToStoppedWorkerFails: a call in flight to a worker process that
// is stopped (SIGSTOP: its kernel still acknowledges every byte) fails with
// ErrPeerLost within the default liveness timeout, saying the worker is
// unresponsive, where it used to wait for the call's whole timeout (60 s
// by default).
func TestCallToStoppedWorkerFails(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a process")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	const token = "liveness-test-token"
	st, err := store.NewTCP(ctx, "127.0.0.1:0", true, store.WithToken(token))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	_, port, _ := net.SplitHostPort(st.Addr())
	child, out := startServingWorker(t, "RANK=1", "WORLD_SIZE=2", "MASTER_ADDR=127.0.0.1", "MASTER_PORT="+port, TokenEnv+"="+token)
	reg := NewRegistry()
	registerBasics(0, reg)
	a, err := Init(ctx, "", 0, 2, WithStore(st), WithRegistry(reg), WithToken(token))
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	defer a.Shutdown(context.Background(), false)
	if v, err := Sync[int](ctx, a, "worker1", "add", [2]int{1, 2}); err != nil || v != 3 {
		t.Fatalf("add before the stop: %v %v", v, err)
	}
	if err := child.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	_, err = Sync[string](ctx, a, "worker1", "sleep", time.Millisecond)
	took := time.Since(start)
	if !errors.Is(err, ErrPeerLost) || !strings.Contains(err.Error(), "unresponsive") || !strings.Contains(err.Error(), "worker1") {
		t.Fatalf("call to a stopped worker: %v after %v, want ErrPeerLost saying worker1 is unresponsive", err, took)
	}
	if took > 10*time.Second || took < DefaultLivenessTimeout-time.Second {
		t.Fatalf("call to a stopped worker failed after %v, want about %v", took, DefaultLivenessTimeout)
	}
	t.Logf("call to a stopped worker failed after %v: %v", took.Round(time.Millisecond), err)
}

// TestConnectToFrozenWorkerFails: a worker whose address accepts the
// connection (the kernel does) but never answers the handshake counts as
// unresponsive after twice the liveness timeout, not after the call's
// timeout.
func TestConnectToFrozenWorkerFails(t *testing.T) {
	agents := startGroup(t, 2, registerBasics, WithLivenessTimeout(300*time.Millisecond))
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			defer c.Close() // accepted, never answered
		}
	}()
	agents[0].addrs[1] = ln.Addr().String()
	start := time.Now()
	_, err = Sync[int](context.Background(), agents[0], "w1", "add", [2]int{1, 1})
	took := time.Since(start)
	if !errors.Is(err, ErrPeerLost) || !strings.Contains(err.Error(), "unresponsive") || !strings.Contains(err.Error(), "w1") {
		t.Fatalf("call to a worker that never answers the handshake: %v after %v", err, took)
	}
	if took > 5*time.Second {
		t.Fatalf("took %v, want about 600ms", took)
	}
}

// TestIdleConnectionStaysAlive: connections with nothing to carry stay up
// over many liveness timeouts, kept alive by heartbeats both ways, and
// heartbeats mixed with traffic (same-host copies included) change nothing.
func TestIdleConnectionStaysAlive(t *testing.T) {
	const timeout = 300 * time.Millisecond
	agents := startGroup(t, 2, registerSum, WithLivenessTimeout(timeout))
	ctx := context.Background()
	for i, a := range agents {
		if _, err := Sync[int](ctx, a, agents[1-i].Self().Name, "add", [2]int{1, 1}); err != nil {
			t.Fatal(err)
		}
	}
	c0, c1 := agents[0].peers[1].cur.Load(), agents[1].peers[0].cur.Load()
	rx0, rx1 := c0.rx.Load(), c1.rx.Load()
	time.Sleep(6 * timeout)
	if c0.dead.Load() || c1.dead.Load() || agents[0].peers[1].cur.Load() != c0 || agents[1].peers[0].cur.Load() != c1 {
		t.Fatal("an idle connection was dropped")
	}
	if c0.rx.Load() == rx0 || c1.rx.Load() == rx1 {
		t.Fatal("no heartbeat arrived on an idle connection")
	}
	// Traffic, large tensors by reference included, while heartbeats flow.
	n := cmaThreshold/4 + 1
	x := dense([]int{n}, make([]float32, n))
	x.Data().([]float32)[n-1] = 7
	deadline := time.Now().Add(3 * timeout)
	for time.Now().Before(deadline) {
		y, err := Sync[*tensor.Dense](ctx, agents[0], "w1", "echo", x)
		if err != nil || !sameTensor(x, y) {
			t.Fatalf("echo with heartbeats: %v", err)
		}
		if _, err := Async[float64](ctx, agents[1], "w0", "sum", x).Wait(ctx); err != nil {
			t.Fatalf("sum with heartbeats: %v", err)
		}
	}
	if agents[0].peers[1].cur.Load() != c0 || agents[1].peers[0].cur.Load() != c1 {
		t.Fatal("a busy connection was replaced")
	}
	for i, err := range shutdownAll(agents) {
		if err != nil {
			t.Fatalf("shutdown w%d: %v", i, err)
		}
	}
}
